//! go-yaml v2's parser (`parserc.go`): the scanner's tokens as events, state for state.

use super::scanner::{ErrorKind, Mark, ScalarStyle, Scanner, Token, TokenType};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    None,
    StreamStart,
    StreamEnd,
    DocumentStart,
    DocumentEnd,
    Alias,
    Scalar,
    SequenceStart,
    SequenceEnd,
    MappingStart,
    MappingEnd,
}

impl EventType {
    /// The name go-yaml prints for it (`yaml_event_type_t.String`).
    pub fn go_name(self) -> &'static str {
        match self {
            EventType::None => "none",
            EventType::StreamStart => "stream start",
            EventType::StreamEnd => "stream end",
            EventType::DocumentStart => "document start",
            EventType::DocumentEnd => "document end",
            EventType::Alias => "alias",
            EventType::Scalar => "scalar",
            EventType::SequenceStart => "sequence start",
            EventType::SequenceEnd => "sequence end",
            EventType::MappingStart => "mapping start",
            EventType::MappingEnd => "mapping end",
        }
    }
}

#[derive(Debug, Clone)]
pub struct Event {
    pub typ: EventType,
    /// Where it starts (go-yaml's node line and column; kept for parity).
    #[allow(dead_code)]
    pub start_mark: Mark,
    pub anchor: Option<Vec<u8>>,
    pub tag: Vec<u8>,
    pub value: Vec<u8>,
    /// Plain implicit (scalars), or no tag (collections).
    pub implicit: bool,
    pub style: ScalarStyle,
}

impl Event {
    fn new(typ: EventType, start_mark: Mark) -> Event {
        Event {
            typ,
            start_mark,
            anchor: None,
            tag: Vec::new(),
            value: Vec::new(),
            implicit: false,
            style: ScalarStyle::Any,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    StreamStart,
    ImplicitDocumentStart,
    DocumentStart,
    DocumentContent,
    DocumentEnd,
    BlockNode,
    BlockSequenceFirstEntry,
    BlockSequenceEntry,
    IndentlessSequenceEntry,
    BlockMappingFirstKey,
    BlockMappingKey,
    BlockMappingValue,
    FlowSequenceFirstEntry,
    FlowSequenceEntry,
    FlowSequenceEntryMappingKey,
    FlowSequenceEntryMappingValue,
    FlowSequenceEntryMappingEnd,
    FlowMappingFirstKey,
    FlowMappingKey,
    FlowMappingValue,
    FlowMappingEmptyValue,
    End,
}

#[derive(Debug, Clone)]
struct TagDirective {
    handle: Vec<u8>,
    prefix: Vec<u8>,
}

/// `yaml_parser_t`: the scanner and the parser's state.
#[derive(Debug)]
pub struct Parser<'a> {
    pub s: Scanner<'a>,
    state: State,
    states: Vec<State>,
    marks: Vec<Mark>,
    tag_directives: Vec<TagDirective>,
}

type R = Option<Event>;

impl<'a> Parser<'a> {
    pub fn new(input: &'a [u8]) -> Parser<'a> {
        Parser {
            s: Scanner::new(input),
            state: State::StreamStart,
            states: Vec::new(),
            marks: Vec::new(),
            tag_directives: Vec::new(),
        }
    }

    fn peek_token(&mut self) -> Option<Token> {
        if self.s.token_available || self.s.fetch_more_tokens() {
            self.s.tokens.front().cloned()
        } else {
            None
        }
    }

    fn skip_token(&mut self) {
        self.s.token_available = false;
        self.s.tokens_parsed += 1;
        if let Some(t) = self.s.tokens.pop_front() {
            self.s.stream_end_produced = t.typ == TokenType::StreamEnd;
        }
    }

    fn set_parser_error(&mut self, problem: &str, problem_mark: Mark) -> R {
        self.s.error = ErrorKind::Parser;
        self.s.problem = problem.to_owned();
        self.s.problem_mark = problem_mark;
        None
    }

    fn set_parser_error_context(
        &mut self,
        context: &str,
        context_mark: Mark,
        problem: &str,
        problem_mark: Mark,
    ) -> R {
        self.s.error = ErrorKind::Parser;
        self.s.context = context.to_owned();
        self.s.context_mark = context_mark;
        self.s.problem = problem.to_owned();
        self.s.problem_mark = problem_mark;
        None
    }

    fn pop_state(&mut self) {
        self.state = self.states.pop().unwrap_or(State::End);
    }

    /// `yaml_parser_parse`: the next event (`Some` of a `None`-typed event after the end),
    /// or `None` on an error (in `self.s`).
    pub fn parse(&mut self) -> R {
        if self.s.stream_end_produced || self.s.error != ErrorKind::None || self.state == State::End
        {
            return Some(Event::new(EventType::None, Mark::default()));
        }
        match self.state {
            State::StreamStart => self.parse_stream_start(),
            State::ImplicitDocumentStart => self.parse_document_start(true),
            State::DocumentStart => self.parse_document_start(false),
            State::DocumentContent => self.parse_document_content(),
            State::DocumentEnd => self.parse_document_end(),
            State::BlockNode => self.parse_node(true, false),
            State::BlockSequenceFirstEntry => self.parse_block_sequence_entry(true),
            State::BlockSequenceEntry => self.parse_block_sequence_entry(false),
            State::IndentlessSequenceEntry => self.parse_indentless_sequence_entry(),
            State::BlockMappingFirstKey => self.parse_block_mapping_key(true),
            State::BlockMappingKey => self.parse_block_mapping_key(false),
            State::BlockMappingValue => self.parse_block_mapping_value(),
            State::FlowSequenceFirstEntry => self.parse_flow_sequence_entry(true),
            State::FlowSequenceEntry => self.parse_flow_sequence_entry(false),
            State::FlowSequenceEntryMappingKey => self.parse_flow_sequence_entry_mapping_key(),
            State::FlowSequenceEntryMappingValue => self.parse_flow_sequence_entry_mapping_value(),
            State::FlowSequenceEntryMappingEnd => self.parse_flow_sequence_entry_mapping_end(),
            State::FlowMappingFirstKey => self.parse_flow_mapping_key(true),
            State::FlowMappingKey => self.parse_flow_mapping_key(false),
            State::FlowMappingValue => self.parse_flow_mapping_value(false),
            State::FlowMappingEmptyValue => self.parse_flow_mapping_value(true),
            State::End => unreachable!("handled above"),
        }
    }

    fn parse_stream_start(&mut self) -> R {
        let token = self.peek_token()?;
        if token.typ != TokenType::StreamStart {
            return self.set_parser_error("did not find expected <stream-start>", token.start_mark);
        }
        self.state = State::ImplicitDocumentStart;
        self.skip_token();
        Some(Event::new(EventType::StreamStart, token.start_mark))
    }

    fn parse_document_start(&mut self, implicit: bool) -> R {
        let mut token = self.peek_token()?;
        if !implicit {
            while token.typ == TokenType::DocumentEnd {
                self.skip_token();
                token = self.peek_token()?;
            }
        }
        if implicit
            && !matches!(
                token.typ,
                TokenType::VersionDirective
                    | TokenType::TagDirective
                    | TokenType::DocumentStart
                    | TokenType::StreamEnd
            )
        {
            self.process_directives()?;
            self.states.push(State::DocumentEnd);
            self.state = State::BlockNode;
            Some(Event::new(EventType::DocumentStart, token.start_mark))
        } else if token.typ != TokenType::StreamEnd {
            let start = token.start_mark;
            self.process_directives()?;
            let token = self.peek_token()?;
            if token.typ != TokenType::DocumentStart {
                return self
                    .set_parser_error("did not find expected <document start>", token.start_mark);
            }
            self.states.push(State::DocumentEnd);
            self.state = State::DocumentContent;
            self.skip_token();
            Some(Event::new(EventType::DocumentStart, start))
        } else {
            self.state = State::End;
            self.skip_token();
            Some(Event::new(EventType::StreamEnd, token.start_mark))
        }
    }

    fn parse_document_content(&mut self) -> R {
        let token = self.peek_token()?;
        if matches!(
            token.typ,
            TokenType::VersionDirective
                | TokenType::TagDirective
                | TokenType::DocumentStart
                | TokenType::DocumentEnd
                | TokenType::StreamEnd
        ) {
            self.pop_state();
            return Some(empty_scalar(token.start_mark));
        }
        self.parse_node(true, false)
    }

    fn parse_document_end(&mut self) -> R {
        let token = self.peek_token()?;
        let start = token.start_mark;
        if token.typ == TokenType::DocumentEnd {
            self.skip_token();
        }
        self.tag_directives.clear();
        self.state = State::DocumentStart;
        Some(Event::new(EventType::DocumentEnd, start))
    }

    fn parse_node(&mut self, block: bool, indentless_sequence: bool) -> R {
        let mut token = self.peek_token()?;
        if token.typ == TokenType::Alias {
            self.pop_state();
            let mut e = Event::new(EventType::Alias, token.start_mark);
            e.anchor = Some(token.value);
            self.skip_token();
            return Some(e);
        }
        let mut start_mark = token.start_mark;
        let mut tag_token = false;
        let (mut tag_handle, mut tag_suffix, mut anchor) = (Vec::new(), Vec::new(), None);
        let mut tag_mark = Mark::default();
        if token.typ == TokenType::Anchor {
            anchor = Some(token.value.clone());
            start_mark = token.start_mark;
            self.skip_token();
            token = self.peek_token()?;
            if token.typ == TokenType::Tag {
                tag_token = true;
                tag_handle = token.value.clone();
                tag_suffix = token.suffix.clone();
                tag_mark = token.start_mark;
                self.skip_token();
                token = self.peek_token()?;
            }
        } else if token.typ == TokenType::Tag {
            tag_token = true;
            tag_handle = token.value.clone();
            tag_suffix = token.suffix.clone();
            start_mark = token.start_mark;
            tag_mark = token.start_mark;
            self.skip_token();
            token = self.peek_token()?;
            if token.typ == TokenType::Anchor {
                anchor = Some(token.value.clone());
                self.skip_token();
                token = self.peek_token()?;
            }
        }
        let mut tag = Vec::new();
        if tag_token {
            if tag_handle.is_empty() {
                tag = tag_suffix;
            } else {
                if let Some(d) = self.tag_directives.iter().find(|d| d.handle == tag_handle) {
                    tag = d.prefix.clone();
                    tag.extend_from_slice(&tag_suffix);
                }
                if tag.is_empty() {
                    return self.set_parser_error_context(
                        "while parsing a node",
                        start_mark,
                        "found undefined tag handle",
                        tag_mark,
                    );
                }
            }
        }
        let implicit = tag.is_empty();
        let collection = |typ, style| {
            let mut e = Event::new(typ, start_mark);
            e.anchor = anchor.clone();
            e.tag = tag.clone();
            e.implicit = implicit;
            e.style = style;
            e
        };
        if indentless_sequence && token.typ == TokenType::BlockEntry {
            self.state = State::IndentlessSequenceEntry;
            return Some(collection(EventType::SequenceStart, ScalarStyle::Any));
        }
        if token.typ == TokenType::Scalar {
            let plain_implicit = (tag.is_empty() && token.style == ScalarStyle::Plain)
                || (tag.len() == 1 && tag[0] == b'!');
            self.pop_state();
            let mut e = Event::new(EventType::Scalar, start_mark);
            e.anchor = anchor;
            e.tag = tag;
            e.value = token.value;
            e.implicit = plain_implicit;
            e.style = token.style;
            self.skip_token();
            return Some(e);
        }
        if token.typ == TokenType::FlowSequenceStart {
            self.state = State::FlowSequenceFirstEntry;
            return Some(collection(EventType::SequenceStart, ScalarStyle::Any));
        }
        if token.typ == TokenType::FlowMappingStart {
            self.state = State::FlowMappingFirstKey;
            return Some(collection(EventType::MappingStart, ScalarStyle::Any));
        }
        if block && token.typ == TokenType::BlockSequenceStart {
            self.state = State::BlockSequenceFirstEntry;
            return Some(collection(EventType::SequenceStart, ScalarStyle::Any));
        }
        if block && token.typ == TokenType::BlockMappingStart {
            self.state = State::BlockMappingFirstKey;
            return Some(collection(EventType::MappingStart, ScalarStyle::Any));
        }
        if anchor.is_some() || !tag.is_empty() {
            self.pop_state();
            let mut e = Event::new(EventType::Scalar, start_mark);
            e.anchor = anchor;
            e.tag = tag;
            e.implicit = implicit;
            e.style = ScalarStyle::Plain;
            return Some(e);
        }
        let context = if block {
            "while parsing a block node"
        } else {
            "while parsing a flow node"
        };
        self.set_parser_error_context(
            context,
            start_mark,
            "did not find expected node content",
            token.start_mark,
        )
    }

    fn first_mark(&mut self, first: bool) -> Option<()> {
        if first {
            let token = self.peek_token()?;
            self.marks.push(token.start_mark);
            self.skip_token();
        }
        Some(())
    }

    fn parse_block_sequence_entry(&mut self, first: bool) -> R {
        self.first_mark(first)?;
        let token = self.peek_token()?;
        if token.typ == TokenType::BlockEntry {
            let mark = token.end_mark;
            self.skip_token();
            let token = self.peek_token()?;
            if token.typ != TokenType::BlockEntry && token.typ != TokenType::BlockEnd {
                self.states.push(State::BlockSequenceEntry);
                return self.parse_node(true, false);
            }
            self.state = State::BlockSequenceEntry;
            return Some(empty_scalar(mark));
        }
        if token.typ == TokenType::BlockEnd {
            self.pop_state();
            self.marks.pop();
            self.skip_token();
            return Some(Event::new(EventType::SequenceEnd, token.start_mark));
        }
        let context_mark = self.marks.pop().unwrap_or_default();
        self.set_parser_error_context(
            "while parsing a block collection",
            context_mark,
            "did not find expected '-' indicator",
            token.start_mark,
        )
    }

    fn parse_indentless_sequence_entry(&mut self) -> R {
        let token = self.peek_token()?;
        if token.typ == TokenType::BlockEntry {
            let mark = token.end_mark;
            self.skip_token();
            let token = self.peek_token()?;
            if !matches!(
                token.typ,
                TokenType::BlockEntry | TokenType::Key | TokenType::Value | TokenType::BlockEnd
            ) {
                self.states.push(State::IndentlessSequenceEntry);
                return self.parse_node(true, false);
            }
            self.state = State::IndentlessSequenceEntry;
            return Some(empty_scalar(mark));
        }
        self.pop_state();
        Some(Event::new(EventType::SequenceEnd, token.start_mark))
    }

    fn parse_block_mapping_key(&mut self, first: bool) -> R {
        self.first_mark(first)?;
        let token = self.peek_token()?;
        if token.typ == TokenType::Key {
            let mark = token.end_mark;
            self.skip_token();
            let token = self.peek_token()?;
            if !matches!(
                token.typ,
                TokenType::Key | TokenType::Value | TokenType::BlockEnd
            ) {
                self.states.push(State::BlockMappingValue);
                return self.parse_node(true, true);
            }
            self.state = State::BlockMappingValue;
            return Some(empty_scalar(mark));
        } else if token.typ == TokenType::BlockEnd {
            self.pop_state();
            self.marks.pop();
            self.skip_token();
            return Some(Event::new(EventType::MappingEnd, token.start_mark));
        }
        let context_mark = self.marks.pop().unwrap_or_default();
        self.set_parser_error_context(
            "while parsing a block mapping",
            context_mark,
            "did not find expected key",
            token.start_mark,
        )
    }

    fn parse_block_mapping_value(&mut self) -> R {
        let token = self.peek_token()?;
        if token.typ == TokenType::Value {
            let mark = token.end_mark;
            self.skip_token();
            let token = self.peek_token()?;
            if !matches!(
                token.typ,
                TokenType::Key | TokenType::Value | TokenType::BlockEnd
            ) {
                self.states.push(State::BlockMappingKey);
                return self.parse_node(true, true);
            }
            self.state = State::BlockMappingKey;
            return Some(empty_scalar(mark));
        }
        self.state = State::BlockMappingKey;
        Some(empty_scalar(token.start_mark))
    }

    fn parse_flow_sequence_entry(&mut self, first: bool) -> R {
        self.first_mark(first)?;
        let mut token = self.peek_token()?;
        if token.typ != TokenType::FlowSequenceEnd {
            if !first {
                if token.typ == TokenType::FlowEntry {
                    self.skip_token();
                    token = self.peek_token()?;
                } else {
                    let context_mark = self.marks.pop().unwrap_or_default();
                    return self.set_parser_error_context(
                        "while parsing a flow sequence",
                        context_mark,
                        "did not find expected ',' or ']'",
                        token.start_mark,
                    );
                }
            }
            if token.typ == TokenType::Key {
                self.state = State::FlowSequenceEntryMappingKey;
                let mut e = Event::new(EventType::MappingStart, token.start_mark);
                e.implicit = true;
                self.skip_token();
                return Some(e);
            } else if token.typ != TokenType::FlowSequenceEnd {
                self.states.push(State::FlowSequenceEntry);
                return self.parse_node(false, false);
            }
        }
        self.pop_state();
        self.marks.pop();
        self.skip_token();
        Some(Event::new(EventType::SequenceEnd, token.start_mark))
    }

    fn parse_flow_sequence_entry_mapping_key(&mut self) -> R {
        let token = self.peek_token()?;
        if !matches!(
            token.typ,
            TokenType::Value | TokenType::FlowEntry | TokenType::FlowSequenceEnd
        ) {
            self.states.push(State::FlowSequenceEntryMappingValue);
            return self.parse_node(false, false);
        }
        let mark = token.end_mark;
        self.skip_token();
        self.state = State::FlowSequenceEntryMappingValue;
        Some(empty_scalar(mark))
    }

    fn parse_flow_sequence_entry_mapping_value(&mut self) -> R {
        let token = self.peek_token()?;
        if token.typ == TokenType::Value {
            self.skip_token();
            let token = self.peek_token()?;
            if token.typ != TokenType::FlowEntry && token.typ != TokenType::FlowSequenceEnd {
                self.states.push(State::FlowSequenceEntryMappingEnd);
                return self.parse_node(false, false);
            }
        }
        self.state = State::FlowSequenceEntryMappingEnd;
        // Go uses the first token's start mark here (its `token` shadowed in the branch).
        Some(empty_scalar(token.start_mark))
    }

    fn parse_flow_sequence_entry_mapping_end(&mut self) -> R {
        let token = self.peek_token()?;
        self.state = State::FlowSequenceEntry;
        Some(Event::new(EventType::MappingEnd, token.start_mark))
    }

    fn parse_flow_mapping_key(&mut self, first: bool) -> R {
        self.first_mark(first)?;
        let mut token = self.peek_token()?;
        if token.typ != TokenType::FlowMappingEnd {
            if !first {
                if token.typ == TokenType::FlowEntry {
                    self.skip_token();
                    token = self.peek_token()?;
                } else {
                    let context_mark = self.marks.pop().unwrap_or_default();
                    return self.set_parser_error_context(
                        "while parsing a flow mapping",
                        context_mark,
                        "did not find expected ',' or '}'",
                        token.start_mark,
                    );
                }
            }
            if token.typ == TokenType::Key {
                self.skip_token();
                token = self.peek_token()?;
                if !matches!(
                    token.typ,
                    TokenType::Value | TokenType::FlowEntry | TokenType::FlowMappingEnd
                ) {
                    self.states.push(State::FlowMappingValue);
                    return self.parse_node(false, false);
                }
                self.state = State::FlowMappingValue;
                return Some(empty_scalar(token.start_mark));
            } else if token.typ != TokenType::FlowMappingEnd {
                self.states.push(State::FlowMappingEmptyValue);
                return self.parse_node(false, false);
            }
        }
        self.pop_state();
        self.marks.pop();
        self.skip_token();
        Some(Event::new(EventType::MappingEnd, token.start_mark))
    }

    fn parse_flow_mapping_value(&mut self, empty: bool) -> R {
        let mut token = self.peek_token()?;
        if empty {
            self.state = State::FlowMappingKey;
            return Some(empty_scalar(token.start_mark));
        }
        if token.typ == TokenType::Value {
            self.skip_token();
            token = self.peek_token()?;
            if token.typ != TokenType::FlowEntry && token.typ != TokenType::FlowMappingEnd {
                self.states.push(State::FlowMappingKey);
                return self.parse_node(false, false);
            }
        }
        self.state = State::FlowMappingKey;
        Some(empty_scalar(token.start_mark))
    }

    fn process_directives(&mut self) -> Option<()> {
        let mut version_seen = false;
        let mut token = self.peek_token()?;
        while token.typ == TokenType::VersionDirective || token.typ == TokenType::TagDirective {
            if token.typ == TokenType::VersionDirective {
                if version_seen {
                    self.set_parser_error("found duplicate %YAML directive", token.start_mark);
                    return None;
                }
                if token.major != 1 || token.minor != 1 {
                    self.set_parser_error("found incompatible YAML document", token.start_mark);
                    return None;
                }
                version_seen = true;
            } else {
                let value = TagDirective {
                    handle: token.value.clone(),
                    prefix: token.prefix.clone(),
                };
                self.append_tag_directive(value, false, token.start_mark)?;
            }
            self.skip_token();
            token = self.peek_token()?;
        }
        for (h, p) in [(&b"!"[..], &b"!"[..]), (b"!!", b"tag:yaml.org,2002:")] {
            let d = TagDirective {
                handle: h.to_vec(),
                prefix: p.to_vec(),
            };
            self.append_tag_directive(d, true, token.start_mark)?;
        }
        Some(())
    }

    fn append_tag_directive(
        &mut self,
        value: TagDirective,
        allow_duplicates: bool,
        mark: Mark,
    ) -> Option<()> {
        if self.tag_directives.iter().any(|d| d.handle == value.handle) {
            if allow_duplicates {
                return Some(());
            }
            self.set_parser_error("found duplicate %TAG directive", mark);
            return None;
        }
        self.tag_directives.push(value);
        Some(())
    }
}

fn empty_scalar(mark: Mark) -> Event {
    let mut e = Event::new(EventType::Scalar, mark);
    e.implicit = true;
    e.style = ScalarStyle::Plain;
    e
}
