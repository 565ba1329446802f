//! go-yaml v2's reader and scanner (`readerc.go`, `scannerc.go`, themselves a port of libyaml),
//! reproduced step for step: the same buffering (512-byte raw chunks, so a bad byte is found
//! when its chunk is decoded, as Go finds it), the same tokens, the same errors with the same
//! marks. Any divergence is a manifest Argo CD reads differently, so the structure follows
//! the original function for function rather than idiomatic Rust.

use std::collections::{HashMap, VecDeque};

/// A position: byte index of the decoded text, 0-based line and column.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mark {
    pub index: usize,
    pub line: usize,
    pub column: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenType {
    StreamStart,
    StreamEnd,
    VersionDirective,
    TagDirective,
    DocumentStart,
    DocumentEnd,
    BlockSequenceStart,
    BlockMappingStart,
    BlockEnd,
    FlowSequenceStart,
    FlowSequenceEnd,
    FlowMappingStart,
    FlowMappingEnd,
    BlockEntry,
    FlowEntry,
    Key,
    Value,
    Alias,
    Anchor,
    Tag,
    Scalar,
}

/// A scalar's style.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ScalarStyle {
    #[default]
    Any,
    Plain,
    SingleQuoted,
    DoubleQuoted,
    Literal,
    Folded,
}

#[derive(Debug, Clone)]
pub struct Token {
    pub typ: TokenType,
    pub start_mark: Mark,
    pub end_mark: Mark,
    /// Scalar, alias and anchor value; tag handle; %TAG handle.
    pub value: Vec<u8>,
    /// Tag suffix.
    pub suffix: Vec<u8>,
    /// %TAG prefix.
    pub prefix: Vec<u8>,
    pub style: ScalarStyle,
    pub major: i8,
    pub minor: i8,
}

impl Token {
    fn new(typ: TokenType, start_mark: Mark, end_mark: Mark) -> Token {
        Token {
            typ,
            start_mark,
            end_mark,
            value: Vec::new(),
            suffix: Vec::new(),
            prefix: Vec::new(),
            style: ScalarStyle::Any,
            major: 0,
            minor: 0,
        }
    }
}

/// Which stage failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    None,
    Reader,
    Scanner,
    Parser,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Encoding {
    Any,
    Utf8,
    Utf16Le,
    Utf16Be,
}

#[derive(Debug, Clone, Copy, Default)]
struct SimpleKey {
    possible: bool,
    required: bool,
    token_number: usize,
    mark: Mark,
}

/// `input_raw_buffer_size`.
const RAW_BUFFER: usize = 512;
const MAX_FLOW_LEVEL: usize = 10000;
const MAX_INDENTS: usize = 10000;
const MAX_NUMBER_LENGTH: i8 = 2;

/// The scanner's state (`yaml_parser_t`'s reader and scanner half).
#[derive(Debug)]
pub struct Scanner<'a> {
    input: &'a [u8],
    input_pos: usize,
    raw: Vec<u8>,
    raw_pos: usize,
    eof: bool,
    buffer: Vec<u8>,
    pub(crate) buffer_pos: usize,
    unread: usize,
    encoding: Encoding,
    offset: usize,
    pub(crate) mark: Mark,

    pub error: ErrorKind,
    pub problem: String,
    pub problem_mark: Mark,
    pub context: String,
    pub context_mark: Mark,

    stream_start_produced: bool,
    pub(crate) stream_end_produced: bool,
    flow_level: usize,
    pub(crate) tokens: VecDeque<Token>,
    pub(crate) tokens_parsed: usize,
    pub(crate) token_available: bool,
    indent: i64,
    indents: Vec<i64>,
    simple_key_allowed: bool,
    simple_keys: Vec<SimpleKey>,
    simple_keys_by_tok: HashMap<usize, usize>,
}

fn width(b: u8) -> usize {
    if b & 0x80 == 0 {
        1
    } else if b & 0xE0 == 0xC0 {
        2
    } else if b & 0xF0 == 0xE0 {
        3
    } else if b & 0xF8 == 0xF0 {
        4
    } else {
        0
    }
}

fn hex_value(b: u8) -> u32 {
    match b {
        b'A'..=b'F' => u32::from(b - b'A' + 10),
        b'a'..=b'f' => u32::from(b - b'a' + 10),
        _ => u32::from(b.wrapping_sub(b'0')),
    }
}

fn push_utf8(s: &mut Vec<u8>, value: u32) {
    if value <= 0x7F {
        s.push(value as u8);
    } else if value <= 0x7FF {
        s.push((0xC0 + (value >> 6)) as u8);
        s.push((0x80 + (value & 0x3F)) as u8);
    } else if value <= 0xFFFF {
        s.push((0xE0 + (value >> 12)) as u8);
        s.push((0x80 + ((value >> 6) & 0x3F)) as u8);
        s.push((0x80 + (value & 0x3F)) as u8);
    } else {
        s.push((0xF0 + (value >> 18)) as u8);
        s.push((0x80 + ((value >> 12) & 0x3F)) as u8);
        s.push((0x80 + ((value >> 6) & 0x3F)) as u8);
        s.push((0x80 + (value & 0x3F)) as u8);
    }
}

impl<'a> Scanner<'a> {
    /// A scanner of `input` (`yaml_parser_set_input_string`).
    pub fn new(input: &'a [u8]) -> Scanner<'a> {
        Scanner {
            input,
            input_pos: 0,
            raw: Vec::with_capacity(RAW_BUFFER),
            raw_pos: 0,
            eof: false,
            buffer: Vec::new(),
            buffer_pos: 0,
            unread: 0,
            encoding: Encoding::Any,
            offset: 0,
            mark: Mark::default(),
            error: ErrorKind::None,
            problem: String::new(),
            problem_mark: Mark::default(),
            context: String::new(),
            context_mark: Mark::default(),
            stream_start_produced: false,
            stream_end_produced: false,
            flow_level: 0,
            tokens: VecDeque::new(),
            tokens_parsed: 0,
            token_available: false,
            indent: 0,
            indents: Vec::new(),
            simple_key_allowed: false,
            simple_keys: Vec::new(),
            simple_keys_by_tok: HashMap::new(),
        }
    }

    // ---- the buffer, as `yamlprivateh.go` reads it (past its end: the zero padding) ----

    fn b(&self, i: usize) -> u8 {
        self.buffer.get(i).copied().unwrap_or(0)
    }
    fn at(&self, k: usize) -> u8 {
        self.b(self.buffer_pos + k)
    }
    fn is_alpha(&self, k: usize) -> bool {
        let c = self.at(k);
        c.is_ascii_alphanumeric() || c == b'_' || c == b'-'
    }
    fn is_digit(&self, k: usize) -> bool {
        self.at(k).is_ascii_digit()
    }
    fn is_hex(&self, k: usize) -> bool {
        self.at(k).is_ascii_hexdigit()
    }
    fn is_z(&self, k: usize) -> bool {
        self.at(k) == 0
    }
    fn is_bom(&self, _k: usize) -> bool {
        // go-yaml checks the buffer's first bytes, not the position's (its own quirk).
        self.b(0) == 0xEF && self.b(1) == 0xBB && self.b(2) == 0xBF
    }
    fn is_space(&self, k: usize) -> bool {
        self.at(k) == b' '
    }
    fn is_tab(&self, k: usize) -> bool {
        self.at(k) == b'\t'
    }
    fn is_blank(&self, k: usize) -> bool {
        matches!(self.at(k), b' ' | b'\t')
    }
    fn is_break(&self, k: usize) -> bool {
        let (a, b, c) = (self.at(k), self.at(k + 1), self.at(k + 2));
        a == b'\r'
            || a == b'\n'
            || (a == 0xC2 && b == 0x85)
            || (a == 0xE2 && b == 0x80 && (c == 0xA8 || c == 0xA9))
    }
    fn is_crlf(&self, k: usize) -> bool {
        self.at(k) == b'\r' && self.at(k + 1) == b'\n'
    }
    fn is_breakz(&self, k: usize) -> bool {
        self.is_break(k) || self.is_z(k)
    }
    fn is_blankz(&self, k: usize) -> bool {
        self.is_blank(k) || self.is_breakz(k)
    }

    // ---- readerc.go ----

    fn set_reader_error(&mut self, problem: &str) -> bool {
        self.error = ErrorKind::Reader;
        self.problem = problem.to_owned();
        false
    }

    fn determine_encoding(&mut self) -> bool {
        while !self.eof && self.raw.len() - self.raw_pos < 3 {
            if !self.update_raw_buffer() {
                return false;
            }
        }
        let buf = &self.raw;
        let pos = self.raw_pos;
        let avail = buf.len() - pos;
        if avail >= 2 && buf[pos] == 0xFF && buf[pos + 1] == 0xFE {
            self.encoding = Encoding::Utf16Le;
            self.raw_pos += 2;
            self.offset += 2;
        } else if avail >= 2 && buf[pos] == 0xFE && buf[pos + 1] == 0xFF {
            self.encoding = Encoding::Utf16Be;
            self.raw_pos += 2;
            self.offset += 2;
        } else if avail >= 3 && buf[pos] == 0xEF && buf[pos + 1] == 0xBB && buf[pos + 2] == 0xBF {
            self.encoding = Encoding::Utf8;
            self.raw_pos += 3;
            self.offset += 3;
        } else {
            self.encoding = Encoding::Utf8;
        }
        true
    }

    fn update_raw_buffer(&mut self) -> bool {
        if self.raw_pos == 0 && self.raw.len() == RAW_BUFFER {
            return true;
        }
        if self.eof {
            return true;
        }
        self.raw.drain(..self.raw_pos);
        self.raw_pos = 0;
        let room = RAW_BUFFER - self.raw.len();
        if self.input_pos == self.input.len() {
            self.eof = true;
        } else {
            let n = room.min(self.input.len() - self.input_pos);
            self.raw
                .extend_from_slice(&self.input[self.input_pos..self.input_pos + n]);
            self.input_pos += n;
        }
        true
    }

    /// `yaml_parser_update_buffer`: at least `length` characters decoded ahead.
    fn update_buffer(&mut self, length: usize) -> bool {
        if self.unread >= length {
            return true;
        }
        if self.encoding == Encoding::Any && !self.determine_encoding() {
            return false;
        }
        // Move the unread characters to the front.
        self.buffer.drain(..self.buffer_pos.min(self.buffer.len()));
        self.buffer_pos = 0;
        // Drop the zero padding a previous call left past the characters.
        let mut buffer_len = self.buffer.len();
        let mut first = true;
        while self.unread < length {
            if (!first || self.raw_pos == self.raw.len()) && !self.update_raw_buffer() {
                self.buffer.truncate(buffer_len);
                return false;
            }
            first = false;
            'inner: while self.raw_pos != self.raw.len() {
                let raw_unread = self.raw.len() - self.raw_pos;
                let (value, width) = match self.encoding {
                    Encoding::Utf8 | Encoding::Any => {
                        let mut octet = self.raw[self.raw_pos];
                        let width = width(octet);
                        if width == 0 {
                            return self.set_reader_error("invalid leading UTF-8 octet");
                        }
                        if width > raw_unread {
                            if self.eof {
                                return self.set_reader_error("incomplete UTF-8 octet sequence");
                            }
                            break 'inner;
                        }
                        let mut value = u32::from(match width {
                            1 => octet & 0x7F,
                            2 => octet & 0x1F,
                            3 => octet & 0x0F,
                            _ => octet & 0x07,
                        });
                        for k in 1..width {
                            octet = self.raw[self.raw_pos + k];
                            if octet & 0xC0 != 0x80 {
                                return self.set_reader_error("invalid trailing UTF-8 octet");
                            }
                            value = (value << 6) + u32::from(octet & 0x3F);
                        }
                        let ok = width == 1
                            || (width == 2 && value >= 0x80)
                            || (width == 3 && value >= 0x800)
                            || (width == 4 && value >= 0x10000);
                        if !ok {
                            return self.set_reader_error("invalid length of a UTF-8 sequence");
                        }
                        if (0xD800..=0xDFFF).contains(&value) || value > 0x10FFFF {
                            return self.set_reader_error("invalid Unicode character");
                        }
                        (value, width)
                    }
                    Encoding::Utf16Le | Encoding::Utf16Be => {
                        let (low, high) = if self.encoding == Encoding::Utf16Le {
                            (0, 1)
                        } else {
                            (1, 0)
                        };
                        if raw_unread < 2 {
                            if self.eof {
                                return self.set_reader_error("incomplete UTF-16 character");
                            }
                            break 'inner;
                        }
                        let p = self.raw_pos;
                        let mut value =
                            u32::from(self.raw[p + low]) + (u32::from(self.raw[p + high]) << 8);
                        if value & 0xFC00 == 0xDC00 {
                            return self.set_reader_error("unexpected low surrogate area");
                        }
                        if value & 0xFC00 == 0xD800 {
                            if raw_unread < 4 {
                                if self.eof {
                                    return self
                                        .set_reader_error("incomplete UTF-16 surrogate pair");
                                }
                                break 'inner;
                            }
                            let value2 = u32::from(self.raw[p + low + 2])
                                + (u32::from(self.raw[p + high + 2]) << 8);
                            if value2 & 0xFC00 != 0xDC00 {
                                return self.set_reader_error("expected low surrogate area");
                            }
                            value = 0x10000 + ((value & 0x3FF) << 10) + (value2 & 0x3FF);
                            (value, 4)
                        } else {
                            (value, 2)
                        }
                    }
                };
                let printable = matches!(value, 0x09 | 0x0A | 0x0D | 0x20..=0x7E | 0x85)
                    || (0xA0..=0xD7FF).contains(&value)
                    || (0xE000..=0xFFFD).contains(&value)
                    || (0x10000..=0x10FFFF).contains(&value);
                if !printable {
                    return self.set_reader_error("control characters are not allowed");
                }
                self.raw_pos += width;
                self.offset += width;
                push_utf8(&mut self.buffer, value);
                buffer_len = self.buffer.len();
                self.unread += 1;
            }
            if self.eof {
                self.buffer.push(0);
                buffer_len += 1;
                self.unread += 1;
                break;
            }
        }
        // Zero padding so that a look `length` bytes ahead reads zeros (Go's `for buffer_len <
        // length`): reads past the end return 0 here anyway.
        self.buffer.truncate(buffer_len);
        true
    }

    fn cache(&mut self, n: usize) -> bool {
        self.unread >= n || self.update_buffer(n)
    }

    // ---- scannerc.go ----

    fn skip(&mut self) {
        self.mark.index += 1;
        self.mark.column += 1;
        self.unread = self.unread.saturating_sub(1);
        self.buffer_pos += width(self.at(0));
    }

    fn skip_line(&mut self) {
        if self.is_crlf(0) {
            self.mark.index += 2;
            self.mark.column = 0;
            self.mark.line += 1;
            self.unread = self.unread.saturating_sub(2);
            self.buffer_pos += 2;
        } else if self.is_break(0) {
            self.mark.index += 1;
            self.mark.column = 0;
            self.mark.line += 1;
            self.unread = self.unread.saturating_sub(1);
            self.buffer_pos += width(self.at(0));
        }
    }

    fn read(&mut self, s: &mut Vec<u8>) {
        let w = width(self.at(0)).max(1);
        let end = (self.buffer_pos + w).min(self.buffer.len());
        s.extend_from_slice(&self.buffer[self.buffer_pos..end]);
        self.buffer_pos += w;
        self.mark.index += 1;
        self.mark.column += 1;
        self.unread = self.unread.saturating_sub(1);
    }

    fn read_line(&mut self, s: &mut Vec<u8>) {
        let (a, b, c) = (self.at(0), self.at(1), self.at(2));
        if a == b'\r' && b == b'\n' {
            s.push(b'\n');
            self.buffer_pos += 2;
            self.mark.index += 1;
            self.unread = self.unread.saturating_sub(1);
        } else if a == b'\r' || a == b'\n' {
            s.push(b'\n');
            self.buffer_pos += 1;
        } else if a == 0xC2 && b == 0x85 {
            s.push(b'\n');
            self.buffer_pos += 2;
        } else if a == 0xE2 && b == 0x80 && (c == 0xA8 || c == 0xA9) {
            s.extend_from_slice(&[a, b, c]);
            self.buffer_pos += 3;
        } else {
            return;
        }
        self.mark.index += 1;
        self.mark.column = 0;
        self.mark.line += 1;
        self.unread = self.unread.saturating_sub(1);
    }

    fn set_scanner_error(&mut self, context: &str, context_mark: Mark, problem: &str) -> bool {
        self.error = ErrorKind::Scanner;
        self.context = context.to_owned();
        self.context_mark = context_mark;
        self.problem = problem.to_owned();
        self.problem_mark = self.mark;
        false
    }

    fn set_scanner_tag_error(
        &mut self,
        directive: bool,
        context_mark: Mark,
        problem: &str,
    ) -> bool {
        let context = if directive {
            "while parsing a %TAG directive"
        } else {
            "while parsing a tag"
        };
        self.set_scanner_error(context, context_mark, problem)
    }

    fn insert_token(&mut self, pos: Option<usize>, token: Token) {
        match pos {
            None => self.tokens.push_back(token),
            Some(p) => self.tokens.insert(p.min(self.tokens.len()), token),
        }
    }

    /// `yaml_parser_fetch_more_tokens`.
    pub(crate) fn fetch_more_tokens(&mut self) -> bool {
        loop {
            if !self.tokens.is_empty() {
                let Some(&i) = self.simple_keys_by_tok.get(&self.tokens_parsed) else {
                    break;
                };
                match self.simple_key_is_valid(i) {
                    None => return false,
                    Some(false) => break,
                    Some(true) => {}
                }
            }
            if !self.fetch_next_token() {
                return false;
            }
        }
        self.token_available = true;
        true
    }

    fn fetch_next_token(&mut self) -> bool {
        if !self.cache(1) {
            return false;
        }
        if !self.stream_start_produced {
            return self.fetch_stream_start();
        }
        if !self.scan_to_next_token() {
            return false;
        }
        self.unroll_indent(self.mark.column as i64);
        if !self.cache(4) {
            return false;
        }
        if self.is_z(0) {
            return self.fetch_stream_end();
        }
        let c = self.at(0);
        if self.mark.column == 0 && c == b'%' {
            return self.fetch_directive();
        }
        if self.mark.column == 0
            && c == b'-'
            && self.at(1) == b'-'
            && self.at(2) == b'-'
            && self.is_blankz(3)
        {
            return self.fetch_document_indicator(TokenType::DocumentStart);
        }
        if self.mark.column == 0
            && c == b'.'
            && self.at(1) == b'.'
            && self.at(2) == b'.'
            && self.is_blankz(3)
        {
            return self.fetch_document_indicator(TokenType::DocumentEnd);
        }
        match c {
            b'[' => return self.fetch_flow_collection_start(TokenType::FlowSequenceStart),
            b'{' => return self.fetch_flow_collection_start(TokenType::FlowMappingStart),
            b']' => return self.fetch_flow_collection_end(TokenType::FlowSequenceEnd),
            b'}' => return self.fetch_flow_collection_end(TokenType::FlowMappingEnd),
            b',' => return self.fetch_flow_entry(),
            _ => {}
        }
        if c == b'-' && self.is_blankz(1) {
            return self.fetch_block_entry();
        }
        if c == b'?' && (self.flow_level > 0 || self.is_blankz(1)) {
            return self.fetch_key();
        }
        if c == b':' && (self.flow_level > 0 || self.is_blankz(1)) {
            return self.fetch_value();
        }
        match c {
            b'*' => return self.fetch_anchor(TokenType::Alias),
            b'&' => return self.fetch_anchor(TokenType::Anchor),
            b'!' => return self.fetch_tag(),
            b'|' if self.flow_level == 0 => return self.fetch_block_scalar(true),
            b'>' if self.flow_level == 0 => return self.fetch_block_scalar(false),
            b'\'' => return self.fetch_flow_scalar(true),
            b'"' => return self.fetch_flow_scalar(false),
            _ => {}
        }
        let indicator = matches!(
            c,
            b'-' | b'?'
                | b':'
                | b','
                | b'['
                | b']'
                | b'{'
                | b'}'
                | b'#'
                | b'&'
                | b'*'
                | b'!'
                | b'|'
                | b'>'
                | b'\''
                | b'"'
                | b'%'
                | b'@'
                | b'`'
        );
        if !(self.is_blankz(0) || indicator)
            || (c == b'-' && !self.is_blank(1))
            || (self.flow_level == 0 && (c == b'?' || c == b':') && !self.is_blankz(1))
        {
            return self.fetch_plain_scalar();
        }
        let m = self.mark;
        self.set_scanner_error(
            "while scanning for the next token",
            m,
            "found character that cannot start any token",
        )
    }

    /// `yaml_simple_key_is_valid`: `None` when it set an error.
    fn simple_key_is_valid(&mut self, i: usize) -> Option<bool> {
        let k = self.simple_keys[i];
        if !k.possible {
            return Some(false);
        }
        if k.mark.line < self.mark.line || k.mark.index + 1024 < self.mark.index {
            if k.required {
                self.set_scanner_error(
                    "while scanning a simple key",
                    k.mark,
                    "could not find expected ':'",
                );
                return None;
            }
            self.simple_keys[i].possible = false;
            return Some(false);
        }
        Some(true)
    }

    fn save_simple_key(&mut self) -> bool {
        let required = self.flow_level == 0 && self.indent == self.mark.column as i64;
        if self.simple_key_allowed {
            let key = SimpleKey {
                possible: true,
                required,
                token_number: self.tokens_parsed + self.tokens.len(),
                mark: self.mark,
            };
            if !self.remove_simple_key() {
                return false;
            }
            let last = self.simple_keys.len() - 1;
            self.simple_keys[last] = key;
            self.simple_keys_by_tok.insert(key.token_number, last);
        }
        true
    }

    fn remove_simple_key(&mut self) -> bool {
        let i = self.simple_keys.len() - 1;
        if self.simple_keys[i].possible {
            if self.simple_keys[i].required {
                let m = self.simple_keys[i].mark;
                return self.set_scanner_error(
                    "while scanning a simple key",
                    m,
                    "could not find expected ':'",
                );
            }
            self.simple_keys[i].possible = false;
            let t = self.simple_keys[i].token_number;
            self.simple_keys_by_tok.remove(&t);
        }
        true
    }

    fn increase_flow_level(&mut self) -> bool {
        self.simple_keys.push(SimpleKey {
            possible: false,
            required: false,
            token_number: self.tokens_parsed + self.tokens.len(),
            mark: self.mark,
        });
        self.flow_level += 1;
        if self.flow_level > MAX_FLOW_LEVEL {
            let m = self.simple_keys[self.simple_keys.len() - 1].mark;
            return self.set_scanner_error(
                "while increasing flow level",
                m,
                &format!("exceeded max depth of {MAX_FLOW_LEVEL}"),
            );
        }
        true
    }

    fn decrease_flow_level(&mut self) {
        if self.flow_level > 0 {
            self.flow_level -= 1;
            if let Some(k) = self.simple_keys.pop() {
                self.simple_keys_by_tok.remove(&k.token_number);
            }
        }
    }

    /// `number`: the token number the BLOCK-START goes before (`None`: at the end).
    fn roll_indent(
        &mut self,
        column: i64,
        number: Option<usize>,
        typ: TokenType,
        mark: Mark,
    ) -> bool {
        if self.flow_level > 0 {
            return true;
        }
        if self.indent < column {
            self.indents.push(self.indent);
            self.indent = column;
            if self.indents.len() > MAX_INDENTS {
                let m = self.simple_keys[self.simple_keys.len() - 1].mark;
                return self.set_scanner_error(
                    "while increasing indent level",
                    m,
                    &format!("exceeded max depth of {MAX_INDENTS}"),
                );
            }
            let token = Token::new(typ, mark, mark);
            let pos = number.and_then(|n| n.checked_sub(self.tokens_parsed));
            self.insert_token(pos, token);
        }
        true
    }

    fn unroll_indent(&mut self, column: i64) {
        if self.flow_level > 0 {
            return;
        }
        while self.indent > column {
            let m = self.mark;
            self.insert_token(None, Token::new(TokenType::BlockEnd, m, m));
            self.indent = self.indents.pop().unwrap_or(-1);
        }
    }

    fn fetch_stream_start(&mut self) -> bool {
        self.indent = -1;
        self.simple_keys.push(SimpleKey::default());
        self.simple_key_allowed = true;
        self.stream_start_produced = true;
        let m = self.mark;
        self.insert_token(None, Token::new(TokenType::StreamStart, m, m));
        true
    }

    fn fetch_stream_end(&mut self) -> bool {
        if self.mark.column != 0 {
            self.mark.column = 0;
            self.mark.line += 1;
        }
        self.unroll_indent(-1);
        if !self.remove_simple_key() {
            return false;
        }
        self.simple_key_allowed = false;
        let m = self.mark;
        self.insert_token(None, Token::new(TokenType::StreamEnd, m, m));
        true
    }

    fn fetch_directive(&mut self) -> bool {
        self.unroll_indent(-1);
        if !self.remove_simple_key() {
            return false;
        }
        self.simple_key_allowed = false;
        let Some(token) = self.scan_directive() else {
            return false;
        };
        self.insert_token(None, token);
        true
    }

    fn fetch_document_indicator(&mut self, typ: TokenType) -> bool {
        self.unroll_indent(-1);
        if !self.remove_simple_key() {
            return false;
        }
        self.simple_key_allowed = false;
        let start = self.mark;
        self.skip();
        self.skip();
        self.skip();
        let end = self.mark;
        self.insert_token(None, Token::new(typ, start, end));
        true
    }

    fn fetch_flow_collection_start(&mut self, typ: TokenType) -> bool {
        if !self.save_simple_key() {
            return false;
        }
        if !self.increase_flow_level() {
            return false;
        }
        self.simple_key_allowed = true;
        let start = self.mark;
        self.skip();
        let end = self.mark;
        self.insert_token(None, Token::new(typ, start, end));
        true
    }

    fn fetch_flow_collection_end(&mut self, typ: TokenType) -> bool {
        if !self.remove_simple_key() {
            return false;
        }
        self.decrease_flow_level();
        self.simple_key_allowed = false;
        let start = self.mark;
        self.skip();
        let end = self.mark;
        self.insert_token(None, Token::new(typ, start, end));
        true
    }

    fn fetch_flow_entry(&mut self) -> bool {
        if !self.remove_simple_key() {
            return false;
        }
        self.simple_key_allowed = true;
        let start = self.mark;
        self.skip();
        let end = self.mark;
        self.insert_token(None, Token::new(TokenType::FlowEntry, start, end));
        true
    }

    fn fetch_block_entry(&mut self) -> bool {
        if self.flow_level == 0 {
            if !self.simple_key_allowed {
                let m = self.mark;
                return self.set_scanner_error(
                    "",
                    m,
                    "block sequence entries are not allowed in this context",
                );
            }
            let (c, m) = (self.mark.column as i64, self.mark);
            if !self.roll_indent(c, None, TokenType::BlockSequenceStart, m) {
                return false;
            }
        }
        if !self.remove_simple_key() {
            return false;
        }
        self.simple_key_allowed = true;
        let start = self.mark;
        self.skip();
        let end = self.mark;
        self.insert_token(None, Token::new(TokenType::BlockEntry, start, end));
        true
    }

    fn fetch_key(&mut self) -> bool {
        if self.flow_level == 0 {
            if !self.simple_key_allowed {
                let m = self.mark;
                return self.set_scanner_error(
                    "",
                    m,
                    "mapping keys are not allowed in this context",
                );
            }
            let (c, m) = (self.mark.column as i64, self.mark);
            if !self.roll_indent(c, None, TokenType::BlockMappingStart, m) {
                return false;
            }
        }
        if !self.remove_simple_key() {
            return false;
        }
        self.simple_key_allowed = self.flow_level == 0;
        let start = self.mark;
        self.skip();
        let end = self.mark;
        self.insert_token(None, Token::new(TokenType::Key, start, end));
        true
    }

    fn fetch_value(&mut self) -> bool {
        let i = self.simple_keys.len() - 1;
        match self.simple_key_is_valid(i) {
            None => return false,
            Some(true) => {
                let k = self.simple_keys[i];
                let token = Token::new(TokenType::Key, k.mark, k.mark);
                // A negative place (the key's token already taken) appends, as Go's does.
                let pos = k.token_number.checked_sub(self.tokens_parsed);
                self.insert_token(pos, token);
                if !self.roll_indent(
                    k.mark.column as i64,
                    Some(k.token_number),
                    TokenType::BlockMappingStart,
                    k.mark,
                ) {
                    return false;
                }
                self.simple_keys[i].possible = false;
                self.simple_keys_by_tok.remove(&k.token_number);
                self.simple_key_allowed = false;
            }
            Some(false) => {
                if self.flow_level == 0 {
                    if !self.simple_key_allowed {
                        let m = self.mark;
                        return self.set_scanner_error(
                            "",
                            m,
                            "mapping values are not allowed in this context",
                        );
                    }
                    let (c, m) = (self.mark.column as i64, self.mark);
                    if !self.roll_indent(c, None, TokenType::BlockMappingStart, m) {
                        return false;
                    }
                }
                self.simple_key_allowed = self.flow_level == 0;
            }
        }
        let start = self.mark;
        self.skip();
        let end = self.mark;
        self.insert_token(None, Token::new(TokenType::Value, start, end));
        true
    }

    fn fetch_anchor(&mut self, typ: TokenType) -> bool {
        if !self.save_simple_key() {
            return false;
        }
        self.simple_key_allowed = false;
        let Some(t) = self.scan_anchor(typ) else {
            return false;
        };
        self.insert_token(None, t);
        true
    }

    fn fetch_tag(&mut self) -> bool {
        if !self.save_simple_key() {
            return false;
        }
        self.simple_key_allowed = false;
        let Some(t) = self.scan_tag() else {
            return false;
        };
        self.insert_token(None, t);
        true
    }

    fn fetch_block_scalar(&mut self, literal: bool) -> bool {
        if !self.remove_simple_key() {
            return false;
        }
        self.simple_key_allowed = true;
        let Some(t) = self.scan_block_scalar(literal) else {
            return false;
        };
        self.insert_token(None, t);
        true
    }

    fn fetch_flow_scalar(&mut self, single: bool) -> bool {
        if !self.save_simple_key() {
            return false;
        }
        self.simple_key_allowed = false;
        let Some(t) = self.scan_flow_scalar(single) else {
            return false;
        };
        self.insert_token(None, t);
        true
    }

    fn fetch_plain_scalar(&mut self) -> bool {
        if !self.save_simple_key() {
            return false;
        }
        self.simple_key_allowed = false;
        let Some(t) = self.scan_plain_scalar() else {
            return false;
        };
        self.insert_token(None, t);
        true
    }

    fn scan_to_next_token(&mut self) -> bool {
        loop {
            if !self.cache(1) {
                return false;
            }
            if self.mark.column == 0 && self.is_bom(0) {
                self.skip();
            }
            if !self.cache(1) {
                return false;
            }
            while self.at(0) == b' '
                || ((self.flow_level > 0 || !self.simple_key_allowed) && self.at(0) == b'\t')
            {
                self.skip();
                if !self.cache(1) {
                    return false;
                }
            }
            if self.at(0) == b'#' {
                while !self.is_breakz(0) {
                    self.skip();
                    if !self.cache(1) {
                        return false;
                    }
                }
            }
            if self.is_break(0) {
                if !self.cache(2) {
                    return false;
                }
                self.skip_line();
                if self.flow_level == 0 {
                    self.simple_key_allowed = true;
                }
            } else {
                break;
            }
        }
        true
    }

    /// Skip blanks, then a comment, then require a line break (or the end) and take it.
    fn end_of_line(&mut self, context: &str, start: Mark) -> bool {
        if !self.cache(1) {
            return false;
        }
        while self.is_blank(0) {
            self.skip();
            if !self.cache(1) {
                return false;
            }
        }
        if self.at(0) == b'#' {
            while !self.is_breakz(0) {
                self.skip();
                if !self.cache(1) {
                    return false;
                }
            }
        }
        if !self.is_breakz(0) {
            return self.set_scanner_error(
                context,
                start,
                "did not find expected comment or line break",
            );
        }
        if self.is_break(0) {
            if !self.cache(2) {
                return false;
            }
            self.skip_line();
        }
        true
    }

    fn scan_directive(&mut self) -> Option<Token> {
        let start = self.mark;
        self.skip();
        let name = self.scan_directive_name(start)?;
        let mut token;
        if name == b"YAML" {
            let (major, minor) = self.scan_version_directive_value(start)?;
            token = Token::new(TokenType::VersionDirective, start, self.mark);
            token.major = major;
            token.minor = minor;
        } else if name == b"TAG" {
            let (handle, prefix) = self.scan_tag_directive_value(start)?;
            token = Token::new(TokenType::TagDirective, start, self.mark);
            token.value = handle;
            token.prefix = prefix;
        } else {
            self.set_scanner_error(
                "while scanning a directive",
                start,
                "found unknown directive name",
            );
            return None;
        }
        if !self.end_of_line("while scanning a directive", start) {
            return None;
        }
        Some(token)
    }

    fn scan_directive_name(&mut self, start: Mark) -> Option<Vec<u8>> {
        if !self.cache(1) {
            return None;
        }
        let mut s = Vec::new();
        while self.is_alpha(0) {
            self.read(&mut s);
            if !self.cache(1) {
                return None;
            }
        }
        if s.is_empty() {
            self.set_scanner_error(
                "while scanning a directive",
                start,
                "could not find expected directive name",
            );
            return None;
        }
        if !self.is_blankz(0) {
            self.set_scanner_error(
                "while scanning a directive",
                start,
                "found unexpected non-alphabetical character",
            );
            return None;
        }
        Some(s)
    }

    fn scan_version_directive_value(&mut self, start: Mark) -> Option<(i8, i8)> {
        if !self.cache(1) {
            return None;
        }
        while self.is_blank(0) {
            self.skip();
            if !self.cache(1) {
                return None;
            }
        }
        let major = self.scan_version_directive_number(start)?;
        if self.at(0) != b'.' {
            self.set_scanner_error(
                "while scanning a %YAML directive",
                start,
                "did not find expected digit or '.' character",
            );
            return None;
        }
        self.skip();
        let minor = self.scan_version_directive_number(start)?;
        Some((major, minor))
    }

    fn scan_version_directive_number(&mut self, start: Mark) -> Option<i8> {
        if !self.cache(1) {
            return None;
        }
        let (mut value, mut length) = (0i8, 0i8);
        while self.is_digit(0) {
            length += 1;
            if length > MAX_NUMBER_LENGTH {
                self.set_scanner_error(
                    "while scanning a %YAML directive",
                    start,
                    "found extremely long version number",
                );
                return None;
            }
            value = value
                .wrapping_mul(10)
                .wrapping_add((self.at(0) - b'0') as i8);
            self.skip();
            if !self.cache(1) {
                return None;
            }
        }
        if length == 0 {
            self.set_scanner_error(
                "while scanning a %YAML directive",
                start,
                "did not find expected version number",
            );
            return None;
        }
        Some(value)
    }

    fn scan_tag_directive_value(&mut self, start: Mark) -> Option<(Vec<u8>, Vec<u8>)> {
        if !self.cache(1) {
            return None;
        }
        while self.is_blank(0) {
            self.skip();
            if !self.cache(1) {
                return None;
            }
        }
        let handle = self.scan_tag_handle(true, start)?;
        if !self.cache(1) {
            return None;
        }
        if !self.is_blank(0) {
            self.set_scanner_error(
                "while scanning a %TAG directive",
                start,
                "did not find expected whitespace",
            );
            return None;
        }
        while self.is_blank(0) {
            self.skip();
            if !self.cache(1) {
                return None;
            }
        }
        let prefix = self.scan_tag_uri(true, &[], start)?;
        if !self.cache(1) {
            return None;
        }
        if !self.is_blankz(0) {
            self.set_scanner_error(
                "while scanning a %TAG directive",
                start,
                "did not find expected whitespace or line break",
            );
            return None;
        }
        Some((handle, prefix))
    }

    fn scan_anchor(&mut self, typ: TokenType) -> Option<Token> {
        let mut s = Vec::new();
        let start = self.mark;
        self.skip();
        if !self.cache(1) {
            return None;
        }
        while self.is_alpha(0) {
            self.read(&mut s);
            if !self.cache(1) {
                return None;
            }
        }
        let end = self.mark;
        let c = self.at(0);
        if s.is_empty()
            || !(self.is_blankz(0)
                || matches!(c, b'?' | b':' | b',' | b']' | b'}' | b'%' | b'@' | b'`'))
        {
            let context = if typ == TokenType::Anchor {
                "while scanning an anchor"
            } else {
                "while scanning an alias"
            };
            self.set_scanner_error(
                context,
                start,
                "did not find expected alphabetic or numeric character",
            );
            return None;
        }
        let mut t = Token::new(typ, start, end);
        t.value = s;
        Some(t)
    }

    fn scan_tag(&mut self) -> Option<Token> {
        let start = self.mark;
        if !self.cache(2) {
            return None;
        }
        let mut handle;
        let suffix;
        if self.at(1) == b'<' {
            handle = Vec::new();
            self.skip();
            self.skip();
            suffix = self.scan_tag_uri(false, &[], start)?;
            if self.at(0) != b'>' {
                self.set_scanner_error(
                    "while scanning a tag",
                    start,
                    "did not find the expected '>'",
                );
                return None;
            }
            self.skip();
        } else {
            handle = self.scan_tag_handle(false, start)?;
            if handle[0] == b'!' && handle.len() > 1 && handle[handle.len() - 1] == b'!' {
                suffix = self.scan_tag_uri(false, &[], start)?;
            } else {
                let mut s = self.scan_tag_uri(false, &handle, start)?;
                handle = vec![b'!'];
                if s.is_empty() {
                    std::mem::swap(&mut handle, &mut s);
                }
                suffix = s;
            }
        }
        if !self.cache(1) {
            return None;
        }
        if !self.is_blankz(0) {
            self.set_scanner_error(
                "while scanning a tag",
                start,
                "did not find expected whitespace or line break",
            );
            return None;
        }
        let mut t = Token::new(TokenType::Tag, start, self.mark);
        t.value = handle;
        t.suffix = suffix;
        Some(t)
    }

    fn scan_tag_handle(&mut self, directive: bool, start: Mark) -> Option<Vec<u8>> {
        if !self.cache(1) {
            return None;
        }
        if self.at(0) != b'!' {
            self.set_scanner_tag_error(directive, start, "did not find expected '!'");
            return None;
        }
        let mut s = Vec::new();
        self.read(&mut s);
        if !self.cache(1) {
            return None;
        }
        while self.is_alpha(0) {
            self.read(&mut s);
            if !self.cache(1) {
                return None;
            }
        }
        if self.at(0) == b'!' {
            self.read(&mut s);
        } else if directive && s != b"!" {
            self.set_scanner_tag_error(directive, start, "did not find expected '!'");
            return None;
        }
        Some(s)
    }

    fn scan_tag_uri(&mut self, directive: bool, head: &[u8], start: Mark) -> Option<Vec<u8>> {
        let mut s = Vec::new();
        let mut has_tag = !head.is_empty();
        if head.len() > 1 {
            s.extend_from_slice(&head[1..]);
        }
        if !self.cache(1) {
            return None;
        }
        loop {
            let c = self.at(0);
            let uri_char = self.is_alpha(0)
                || matches!(
                    c,
                    b';' | b'/'
                        | b'?'
                        | b':'
                        | b'@'
                        | b'&'
                        | b'='
                        | b'+'
                        | b'$'
                        | b','
                        | b'.'
                        | b'!'
                        | b'~'
                        | b'*'
                        | b'\''
                        | b'('
                        | b')'
                        | b'['
                        | b']'
                        | b'%'
                );
            if !uri_char {
                break;
            }
            if c == b'%' {
                if !self.scan_uri_escapes(directive, start, &mut s) {
                    return None;
                }
            } else {
                self.read(&mut s);
            }
            if !self.cache(1) {
                return None;
            }
            has_tag = true;
        }
        if !has_tag {
            self.set_scanner_tag_error(directive, start, "did not find expected tag URI");
            return None;
        }
        Some(s)
    }

    fn scan_uri_escapes(&mut self, directive: bool, start: Mark, s: &mut Vec<u8>) -> bool {
        let mut w = 1024;
        while w > 0 {
            if !self.cache(3) {
                return false;
            }
            if !(self.at(0) == b'%' && self.is_hex(1) && self.is_hex(2)) {
                return self.set_scanner_tag_error(
                    directive,
                    start,
                    "did not find URI escaped octet",
                );
            }
            let octet = ((hex_value(self.at(1)) << 4) + hex_value(self.at(2))) as u8;
            if w == 1024 {
                w = width(octet);
                if w == 0 {
                    return self.set_scanner_tag_error(
                        directive,
                        start,
                        "found an incorrect leading UTF-8 octet",
                    );
                }
            } else if octet & 0xC0 != 0x80 {
                return self.set_scanner_tag_error(
                    directive,
                    start,
                    "found an incorrect trailing UTF-8 octet",
                );
            }
            s.push(octet);
            self.skip();
            self.skip();
            self.skip();
            w -= 1;
        }
        true
    }

    fn scan_block_scalar(&mut self, literal: bool) -> Option<Token> {
        let start = self.mark;
        self.skip();
        if !self.cache(1) {
            return None;
        }
        let (mut chomping, mut increment) = (0i32, 0i64);
        if self.at(0) == b'+' || self.at(0) == b'-' {
            chomping = if self.at(0) == b'+' { 1 } else { -1 };
            self.skip();
            if !self.cache(1) {
                return None;
            }
            if self.is_digit(0) {
                if self.at(0) == b'0' {
                    self.set_scanner_error(
                        "while scanning a block scalar",
                        start,
                        "found an indentation indicator equal to 0",
                    );
                    return None;
                }
                increment = i64::from(self.at(0) - b'0');
                self.skip();
            }
        } else if self.is_digit(0) {
            if self.at(0) == b'0' {
                self.set_scanner_error(
                    "while scanning a block scalar",
                    start,
                    "found an indentation indicator equal to 0",
                );
                return None;
            }
            increment = i64::from(self.at(0) - b'0');
            self.skip();
            if !self.cache(1) {
                return None;
            }
            if self.at(0) == b'+' || self.at(0) == b'-' {
                chomping = if self.at(0) == b'+' { 1 } else { -1 };
                self.skip();
            }
        }
        if !self.end_of_line("while scanning a block scalar", start) {
            return None;
        }
        let mut end = self.mark;
        let mut indent: i64 = 0;
        if increment > 0 {
            indent = if self.indent >= 0 {
                self.indent + increment
            } else {
                increment
            };
        }
        let (mut s, mut leading_break, mut trailing_breaks) = (Vec::new(), Vec::new(), Vec::new());
        if !self.scan_block_scalar_breaks(&mut indent, &mut trailing_breaks, start, &mut end) {
            return None;
        }
        if !self.cache(1) {
            return None;
        }
        let (mut leading_blank, mut trailing_blank);
        leading_blank = false;
        while self.mark.column as i64 == indent && !self.is_z(0) {
            trailing_blank = self.is_blank(0);
            if !literal
                && !leading_blank
                && !trailing_blank
                && leading_break.first() == Some(&b'\n')
            {
                if trailing_breaks.is_empty() {
                    s.push(b' ');
                }
            } else {
                s.extend_from_slice(&leading_break);
            }
            leading_break.clear();
            s.extend_from_slice(&trailing_breaks);
            trailing_breaks.clear();
            leading_blank = self.is_blank(0);
            while !self.is_breakz(0) {
                self.read(&mut s);
                if !self.cache(1) {
                    return None;
                }
            }
            if !self.cache(2) {
                return None;
            }
            self.read_line(&mut leading_break);
            if !self.scan_block_scalar_breaks(&mut indent, &mut trailing_breaks, start, &mut end) {
                return None;
            }
        }
        if chomping != -1 {
            s.extend_from_slice(&leading_break);
        }
        if chomping == 1 {
            s.extend_from_slice(&trailing_breaks);
        }
        let mut t = Token::new(TokenType::Scalar, start, end);
        t.value = s;
        t.style = if literal {
            ScalarStyle::Literal
        } else {
            ScalarStyle::Folded
        };
        Some(t)
    }

    fn scan_block_scalar_breaks(
        &mut self,
        indent: &mut i64,
        breaks: &mut Vec<u8>,
        start: Mark,
        end: &mut Mark,
    ) -> bool {
        *end = self.mark;
        let mut max_indent: i64 = 0;
        loop {
            if !self.cache(1) {
                return false;
            }
            while (*indent == 0 || (self.mark.column as i64) < *indent) && self.is_space(0) {
                self.skip();
                if !self.cache(1) {
                    return false;
                }
            }
            if self.mark.column as i64 > max_indent {
                max_indent = self.mark.column as i64;
            }
            if (*indent == 0 || (self.mark.column as i64) < *indent) && self.is_tab(0) {
                return self.set_scanner_error(
                    "while scanning a block scalar",
                    start,
                    "found a tab character where an indentation space is expected",
                );
            }
            if !self.is_break(0) {
                break;
            }
            if !self.cache(2) {
                return false;
            }
            self.read_line(breaks);
            *end = self.mark;
        }
        if *indent == 0 {
            *indent = max_indent;
            if *indent < self.indent + 1 {
                *indent = self.indent + 1;
            }
            if *indent < 1 {
                *indent = 1;
            }
        }
        true
    }

    fn document_indicator_here(&self) -> bool {
        self.mark.column == 0
            && ((self.at(0) == b'-' && self.at(1) == b'-' && self.at(2) == b'-')
                || (self.at(0) == b'.' && self.at(1) == b'.' && self.at(2) == b'.'))
            && self.is_blankz(3)
    }

    fn scan_flow_scalar(&mut self, single: bool) -> Option<Token> {
        let start = self.mark;
        self.skip();
        let (mut s, mut leading_break, mut trailing_breaks, mut whitespaces) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        loop {
            if !self.cache(4) {
                return None;
            }
            if self.document_indicator_here() {
                self.set_scanner_error(
                    "while scanning a quoted scalar",
                    start,
                    "found unexpected document indicator",
                );
                return None;
            }
            if self.is_z(0) {
                self.set_scanner_error(
                    "while scanning a quoted scalar",
                    start,
                    "found unexpected end of stream",
                );
                return None;
            }
            let mut leading_blanks = false;
            while !self.is_blankz(0) {
                let c = self.at(0);
                if single && c == b'\'' && self.at(1) == b'\'' {
                    s.push(b'\'');
                    self.skip();
                    self.skip();
                } else if (single && c == b'\'') || (!single && c == b'"') {
                    break;
                } else if !single && c == b'\\' && self.is_break(1) {
                    if !self.cache(3) {
                        return None;
                    }
                    self.skip();
                    self.skip_line();
                    leading_blanks = true;
                    break;
                } else if !single && c == b'\\' {
                    let mut code_length = 0;
                    match self.at(1) {
                        b'0' => s.push(0),
                        b'a' => s.push(0x07),
                        b'b' => s.push(0x08),
                        b't' | b'\t' => s.push(0x09),
                        b'n' => s.push(0x0A),
                        b'v' => s.push(0x0B),
                        b'f' => s.push(0x0C),
                        b'r' => s.push(0x0D),
                        b'e' => s.push(0x1B),
                        b' ' => s.push(0x20),
                        b'"' => s.push(b'"'),
                        b'\'' => s.push(b'\''),
                        b'\\' => s.push(b'\\'),
                        b'N' => s.extend_from_slice(&[0xC2, 0x85]),
                        b'_' => s.extend_from_slice(&[0xC2, 0xA0]),
                        b'L' => s.extend_from_slice(&[0xE2, 0x80, 0xA8]),
                        b'P' => s.extend_from_slice(&[0xE2, 0x80, 0xA9]),
                        b'x' => code_length = 2,
                        b'u' => code_length = 4,
                        b'U' => code_length = 8,
                        _ => {
                            self.set_scanner_error(
                                "while parsing a quoted scalar",
                                start,
                                "found unknown escape character",
                            );
                            return None;
                        }
                    }
                    self.skip();
                    self.skip();
                    if code_length > 0 {
                        if !self.cache(code_length) {
                            return None;
                        }
                        let mut value: u32 = 0;
                        for k in 0..code_length {
                            if !self.is_hex(k) {
                                self.set_scanner_error(
                                    "while parsing a quoted scalar",
                                    start,
                                    "did not find expected hexdecimal number",
                                );
                                return None;
                            }
                            value = (value << 4) + hex_value(self.at(k));
                        }
                        if (0xD800..=0xDFFF).contains(&value) || value > 0x10FFFF {
                            self.set_scanner_error(
                                "while parsing a quoted scalar",
                                start,
                                "found invalid Unicode character escape code",
                            );
                            return None;
                        }
                        push_utf8(&mut s, value);
                        for _ in 0..code_length {
                            self.skip();
                        }
                    }
                } else {
                    self.read(&mut s);
                }
                if !self.cache(2) {
                    return None;
                }
            }
            if !self.cache(1) {
                return None;
            }
            if (single && self.at(0) == b'\'') || (!single && self.at(0) == b'"') {
                break;
            }
            while self.is_blank(0) || self.is_break(0) {
                if self.is_blank(0) {
                    if leading_blanks {
                        self.skip();
                    } else {
                        self.read(&mut whitespaces);
                    }
                } else {
                    if !self.cache(2) {
                        return None;
                    }
                    if leading_blanks {
                        self.read_line(&mut trailing_breaks);
                    } else {
                        whitespaces.clear();
                        self.read_line(&mut leading_break);
                        leading_blanks = true;
                    }
                }
                if !self.cache(1) {
                    return None;
                }
            }
            if leading_blanks {
                if leading_break.first() == Some(&b'\n') {
                    if trailing_breaks.is_empty() {
                        s.push(b' ');
                    } else {
                        s.extend_from_slice(&trailing_breaks);
                    }
                } else {
                    s.extend_from_slice(&leading_break);
                    s.extend_from_slice(&trailing_breaks);
                }
                trailing_breaks.clear();
                leading_break.clear();
            } else {
                s.extend_from_slice(&whitespaces);
                whitespaces.clear();
            }
        }
        self.skip();
        let mut t = Token::new(TokenType::Scalar, start, self.mark);
        t.value = s;
        t.style = if single {
            ScalarStyle::SingleQuoted
        } else {
            ScalarStyle::DoubleQuoted
        };
        Some(t)
    }

    fn scan_plain_scalar(&mut self) -> Option<Token> {
        let (mut s, mut leading_break, mut trailing_breaks, mut whitespaces) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut leading_blanks = false;
        let indent = self.indent + 1;
        let start = self.mark;
        let mut end = self.mark;
        loop {
            if !self.cache(4) {
                return None;
            }
            if self.document_indicator_here() {
                break;
            }
            if self.at(0) == b'#' {
                break;
            }
            while !self.is_blankz(0) {
                let c = self.at(0);
                if (c == b':' && self.is_blankz(1))
                    || (self.flow_level > 0 && matches!(c, b',' | b'?' | b'[' | b']' | b'{' | b'}'))
                {
                    break;
                }
                if leading_blanks || !whitespaces.is_empty() {
                    if leading_blanks {
                        if leading_break.first() == Some(&b'\n') {
                            if trailing_breaks.is_empty() {
                                s.push(b' ');
                            } else {
                                s.extend_from_slice(&trailing_breaks);
                            }
                        } else {
                            s.extend_from_slice(&leading_break);
                            s.extend_from_slice(&trailing_breaks);
                        }
                        trailing_breaks.clear();
                        leading_break.clear();
                        leading_blanks = false;
                    } else {
                        s.extend_from_slice(&whitespaces);
                        whitespaces.clear();
                    }
                }
                self.read(&mut s);
                end = self.mark;
                if !self.cache(2) {
                    return None;
                }
            }
            if !(self.is_blank(0) || self.is_break(0)) {
                break;
            }
            if !self.cache(1) {
                return None;
            }
            while self.is_blank(0) || self.is_break(0) {
                if self.is_blank(0) {
                    if leading_blanks && (self.mark.column as i64) < indent && self.is_tab(0) {
                        self.set_scanner_error(
                            "while scanning a plain scalar",
                            start,
                            "found a tab character that violates indentation",
                        );
                        return None;
                    }
                    if leading_blanks {
                        self.skip();
                    } else {
                        self.read(&mut whitespaces);
                    }
                } else {
                    if !self.cache(2) {
                        return None;
                    }
                    if leading_blanks {
                        self.read_line(&mut trailing_breaks);
                    } else {
                        whitespaces.clear();
                        self.read_line(&mut leading_break);
                        leading_blanks = true;
                    }
                }
                if !self.cache(1) {
                    return None;
                }
            }
            if self.flow_level == 0 && (self.mark.column as i64) < indent {
                break;
            }
        }
        let mut t = Token::new(TokenType::Scalar, start, end);
        t.value = s;
        t.style = ScalarStyle::Plain;
        if leading_blanks {
            self.simple_key_allowed = true;
        }
        Some(t)
    }
}
