//! (c) Structure-aware: a list of entries (names and targets from a small alphabet so that
//! collisions, nesting, `..` runs and links through links are frequent) rendered by the
//! test-side builder, with optional PAX records and raw header overrides.
#![no_main]

use arbitrary::Arbitrary;
use testkit::{Hdr, Magic, TarBuilder, pax_record};

const PARTS: &[&str] = &[
    "a", "b", "..", ".", "", "c", "/", "d", "\\", "x\0", "link", "üñ",
];

#[derive(Debug, Arbitrary)]
struct Name(Vec<u8>);

impl Name {
    fn render(&self) -> String {
        let mut s = String::new();
        for (i, p) in self.0.iter().take(12).enumerate() {
            if i > 0 && p % 5 != 0 {
                s.push('/');
            }
            s.push_str(PARTS[*p as usize % PARTS.len()]);
        }
        s
    }
}

#[derive(Debug, Arbitrary)]
enum Kind {
    File(u16, u16),
    Dir,
    Symlink(Name),
    Hardlink(Name),
    Other(u8),
}

#[derive(Debug, Arbitrary)]
struct Op {
    name: Name,
    kind: Kind,
    pax: Vec<(u8, Name)>,
    override_at: Option<(u16, u8)>,
    gnu_magic: bool,
}

#[derive(Debug, Arbitrary)]
struct Input {
    ops: Vec<Op>,
    trailer: Vec<u8>,
}

const PAX_KEYS: &[&str] = &[
    "path",
    "linkpath",
    "size",
    "mtime",
    "uid",
    "comment",
    "GNU.sparse.size",
];

libfuzzer_sys::fuzz_target!(|input: Input| {
    let mut t = TarBuilder::new();
    for op in input.ops.iter().take(64) {
        if !op.pax.is_empty() {
            let body: Vec<u8> = op
                .pax
                .iter()
                .take(4)
                .flat_map(|(k, v)| {
                    pax_record(
                        PAX_KEYS[*k as usize % PAX_KEYS.len()],
                        v.render().as_bytes(),
                    )
                })
                .collect();
            t.pax_raw(&body);
        }
        let (tf, link, data): (u8, String, Vec<u8>) = match &op.kind {
            Kind::File(len, fill) => (
                b'0',
                String::new(),
                vec![*fill as u8; (*len % 2048) as usize],
            ),
            Kind::Dir => (b'5', String::new(), Vec::new()),
            Kind::Symlink(n) => (b'2', n.render(), Vec::new()),
            Kind::Hardlink(n) => (b'1', n.render(), Vec::new()),
            Kind::Other(b) => (*b, String::new(), Vec::new()),
        };
        let mut h = Hdr::new(op.name.render(), tf);
        h.linkname = link.into_bytes();
        h.size = data.len() as u64;
        h.mode = 0o4777;
        if op.gnu_magic {
            h.magic = Magic::Gnu;
        }
        if let Some((at, byte)) = op.override_at {
            h.overrides.push(((at % 512) as usize, vec![byte]));
        }
        t.header(&h).data(&data);
    }
    let mut tar = t.finish();
    tar.extend(input.trailer.iter().take(2048));
    cmp_warden_fuzz::run_tgz(&cmp_warden_fuzz::gzip_fast(&tar));
});
