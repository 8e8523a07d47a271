//! Tickets: what an allowed acquire or a report took, so that a refund can give the units back
//! where they were taken from, and nowhere else, at most once in all.
//!
//! A ticket names the units taken, the take's time, one mark per limit (the time the take stops
//! counting, and for a token bucket or GCRA the limit's refund count then: [`Mark`], from which
//! each algorithm tells whether its window, log entry or undrained units are still there:
//! [`crate::limiter::Rule::refund`]), a random id, and the key that signed it. It is opaque to
//! clients: `3.<key id>.<id: 16 hex>.<units>.<taken at>.<mark>[-<refund count>][.<mark>…].<tag:
//! 32 hex>`, a count of 0 left out. A ticket of version 2 (no take time, no counts: issued
//! before counts were kept) is still read, as taken before any state's life began, so that it
//! gives back on the windows and logs as it did, and nothing on a token bucket or GCRA, where
//! it cannot tell what the refunds since its take have moved up.
//!
//! - Authenticated: the tag is HMAC-SHA256 (truncated to 128 bits) of everything before it and
//!   of the subject (policy and key), under a key every instance shares ([`Keyring`]): a ticket
//!   altered in any field, or sent with another subject, is refused; nobody without the key can
//!   make one. Tags are compared in constant time (`subtle`).
//! - Spent at most once in all: the store records, per ticket id, the units refunded with it,
//!   in the same atomic step as the refund (the Redis refund script, on the subject's hash tag;
//!   the embedded store's shard lock), until the ticket can give nothing back any more; a refund
//!   gives back at most the ticket's units less what it has already given ([`Claim`]), however
//!   often and however concurrently the ticket is sent.
//! - Keys rotate without ending live tickets: the ring holds the current key, which signs, and
//!   the previous one, which still verifies; each ticket names its key's id.

use std::fmt;
use std::sync::RwLock;

use hmac::digest::KeyInit;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

use crate::limiter::{Mark, Verdict, MAX_LIMITS};
use crate::policy::{LimitKey, Policy};

/// The version of the format, its first field.
const VERSION: &str = "3";
/// The version before, still read (see the module doc).
const VERSION_2: &str = "2";

/// Longest ticket accepted, in bytes: the longest one issued (8 marks, each with a refund count
/// below 2^52) is under 400.
pub const MAX_TICKET_BYTES: usize = 512;

/// Bytes of a signing key.
pub const KEY_BYTES: usize = 32;
/// Bytes of the tag kept in a ticket: 128 bits, beyond guessing.
const TAG_BYTES: usize = 16;

type HmacSha256 = Hmac<Sha256>;

/// Why a text is not a ticket this service can apply.
pub const MALFORMED: &str = "is not a ticket this service issued";
/// A well-formed ticket whose tag does not verify for this subject.
pub const FORGED: &str = "is not a ticket this service issued for this policy and key";
/// A ticket signed by a key the ring no longer (or does not yet) hold.
pub const UNKNOWN_KEY: &str = "was signed with a key that has been rotated out";

/// A parsed or issued ticket.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticket {
    /// The units taken.
    pub units: u64,
    /// The signing key's id.
    key_id: u32,
    /// The ticket's own id: names its record of what it has given back.
    pub id: u64,
    /// Read from a ticket of version 2, whose body is written as that version's.
    v2: bool,
    marks: [Mark; MAX_LIMITS],
    len: usize,
    tag: [u8; TAG_BYTES],
}

/// One signing key.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Key {
    pub id: u32,
    secret: [u8; KEY_BYTES],
}

impl fmt::Debug for Key {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Key({}, <redacted>)", self.id)
    }
}

impl Key {
    pub fn new(id: u32, secret: [u8; KEY_BYTES]) -> Self {
        Self { id, secret }
    }

    /// A fresh key with this id, from the operating system's CSPRNG.
    pub fn random(id: u32) -> Result<Self, getrandom::Error> {
        let mut secret = [0; KEY_BYTES];
        getrandom::fill(&mut secret)?;
        Ok(Self { id, secret })
    }

    fn mac(&self) -> HmacSha256 {
        // HMAC pads a key shorter than its block with zeros: the block-sized key is the same
        // key, and takes a constructor that cannot fail.
        let mut block = [0u8; 64];
        block[..KEY_BYTES].copy_from_slice(&self.secret);
        <HmacSha256 as KeyInit>::new(&block.into())
    }

    /// `<id>:<64 hex>`, as the store keeps it.
    fn text(&self) -> String {
        let mut s = format!("{}:", self.id);
        for b in self.secret {
            s.push_str(&format!("{b:02x}"));
        }
        s
    }

    fn parse(s: &str) -> Option<Self> {
        let (id, hex) = s.split_once(':')?;
        let id = id.parse().ok()?;
        if hex.len() != 2 * KEY_BYTES {
            return None;
        }
        let mut secret = [0; KEY_BYTES];
        for (i, b) in secret.iter_mut().enumerate() {
            *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
        }
        Some(Self { id, secret })
    }
}

/// The keys that sign and verify tickets: the current one, which signs, and the previous one,
/// which still verifies (so that a rotation ends no live ticket). On Redis the ring is one
/// string shared by every instance, `<id>:<hex>[ <id>:<hex>]`, current first
/// ([`Keyring::parse`]); the embedded store's is a random key of this process.
#[derive(Debug, Default)]
pub struct Keyring {
    keys: RwLock<Ring>,
}

#[derive(Debug, Default)]
struct Ring {
    current: Option<Signer>,
    previous: Option<Signer>,
}

/// A key with its HMAC keyed once, so that signing a ticket (on every allowed acquire) hashes
/// the ticket alone.
#[derive(Clone)]
struct Signer {
    key: Key,
    mac: HmacSha256,
}

impl Signer {
    fn new(key: Key) -> Self {
        Self {
            mac: key.mac(),
            key,
        }
    }
}

impl fmt::Debug for Signer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.key.fmt(f)
    }
}

impl Keyring {
    /// A ring of one key.
    pub fn of(key: Key) -> Self {
        let ring = Keyring::default();
        ring.set(Some(key), None);
        ring
    }

    fn set(&self, current: Option<Key>, previous: Option<Key>) {
        let ring = Ring {
            current: current.map(Signer::new),
            previous: previous.map(Signer::new),
        };
        *self.keys.write().unwrap_or_else(|e| e.into_inner()) = ring;
    }

    /// `f` of the ring, read under its lock.
    fn with_ring<R>(&self, f: impl FnOnce(&Ring) -> R) -> R {
        f(&self.keys.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Replaces the ring with the store's text of it, or says it is not one (the ring is then
    /// left as it was).
    pub fn load(&self, text: &str) -> Result<(), &'static str> {
        let mut keys = text.split_ascii_whitespace().map(Key::parse);
        let current = keys.next().flatten().ok_or("no current key")?;
        let previous = match keys.next() {
            None => None,
            Some(Some(k)) if k.id != current.id => Some(k),
            Some(_) => return Err("a malformed previous key"),
        };
        self.set(Some(current), previous);
        Ok(())
    }

    /// The store's text of a ring with one key.
    pub fn text_of(key: &Key) -> String {
        key.text()
    }

    /// Whether a key signs: none before the ring is first loaded.
    pub fn is_loaded(&self) -> bool {
        self.with_ring(|r| r.current.is_some())
    }

    /// The store's text of the current key alone (the embedded store's rotation starts from it).
    pub fn current_text(&self) -> Option<String> {
        self.with_ring(|r| r.current.as_ref().map(|s| s.key.text()))
    }

    /// The current key's id, for logs.
    pub fn current_id(&self) -> Option<u32> {
        self.with_ring(|r| r.current.as_ref().map(|s| s.key.id))
    }

    /// The keyed HMAC of the key `id`, if the ring holds it.
    fn find(&self, id: u32) -> Option<HmacSha256> {
        self.with_ring(|r| {
            [&r.current, &r.previous]
                .into_iter()
                .flatten()
                .find(|s| s.key.id == id)
                .map(|s| s.mac.clone())
        })
    }

    /// Whether the ring holds the key `id`.
    pub fn knows(&self, id: u32) -> bool {
        self.find(id).is_some()
    }

    /// The ticket of `units` taken from `policy`'s subject `key` by `verdict`, with the fresh
    /// id `id`, signed with the current key; `None` before the ring is loaded.
    pub fn issue(
        &self,
        policy: &Policy,
        key: &LimitKey,
        units: u64,
        verdict: &Verdict,
        id: u64,
    ) -> Option<Ticket> {
        let (key_id, mac) =
            self.with_ring(|r| r.current.as_ref().map(|s| (s.key.id, s.mac.clone())))?;
        let mut marks = [Mark::default(); MAX_LIMITS];
        let mut len = 0;
        for (slot, mark) in marks.iter_mut().zip(verdict.marks()) {
            *slot = mark;
            len += 1;
        }
        let mut t = Ticket {
            units,
            key_id,
            id,
            v2: false,
            marks,
            len,
            tag: [0; TAG_BYTES],
        };
        t.tag = t.compute_tag(mac, policy, key);
        Some(t)
    }

    /// The ticket `text` if this ring signed it for `policy`'s subject `key`, or why not.
    pub fn verify(
        &self,
        text: &str,
        policy: &Policy,
        key: &LimitKey,
    ) -> Result<Ticket, &'static str> {
        let t = Ticket::parse(text)?;
        let mac = self.find(t.key_id).ok_or(UNKNOWN_KEY)?;
        let expected = t.compute_tag(mac, policy, key);
        if bool::from(expected.ct_eq(&t.tag)) {
            Ok(t)
        } else {
            Err(FORGED)
        }
    }
}

/// The store's text of the ring after rotating in `fresh` (as the rotation script does): the
/// fresh key, whose id follows the current one's, then the current one, now previous.
pub fn rotated(text: Option<&str>, fresh: [u8; KEY_BYTES]) -> String {
    let current = text.and_then(|t| t.split_ascii_whitespace().next());
    match current.and_then(Key::parse) {
        Some(cur) => format!(
            "{} {}",
            Key::new(cur.id.wrapping_add(1).max(1), fresh).text(),
            cur.text()
        ),
        None => Key::new(1, fresh).text(),
    }
}

impl Ticket {
    /// Writes the text that is signed: everything before the tag (without allocating: it is
    /// written, and hashed, on every allowed acquire).
    fn write_body(&self, w: &mut impl fmt::Write) -> fmt::Result {
        let mut n = itoa::Buffer::new();
        let mut id = [0; 16];
        w.write_str(if self.v2 { VERSION_2 } else { VERSION })?;
        w.write_char('.')?;
        w.write_str(n.format(self.key_id))?;
        w.write_char('.')?;
        w.write_str(hex(&self.id.to_be_bytes(), &mut id))?;
        w.write_char('.')?;
        w.write_str(n.format(self.units))?;
        let marks = &self.marks[..self.len];
        if !self.v2 {
            w.write_char('.')?;
            w.write_str(n.format(marks.first().map_or(0, |m| m.taken_us)))?;
        }
        for mark in marks {
            w.write_char('.')?;
            w.write_str(n.format(mark.at))?;
            if mark.refunded > 0 {
                w.write_char('-')?;
                w.write_str(n.format(mark.refunded))?;
            }
        }
        Ok(())
    }

    /// The tag under `mac`, the signing key's keyed HMAC.
    fn compute_tag(
        &self,
        mut mac: HmacSha256,
        policy: &Policy,
        subject: &LimitKey,
    ) -> [u8; TAG_BYTES] {
        /// Hashes what is written to it.
        struct Hashed<'a>(&'a mut HmacSha256);
        impl fmt::Write for Hashed<'_> {
            fn write_str(&mut self, s: &str) -> fmt::Result {
                self.0.update(s.as_bytes());
                Ok(())
            }
        }
        // Writing to a hash cannot fail.
        let _ = self.write_body(&mut Hashed(&mut mac));
        // The body has no NUL, nor has a policy's name: the key is what follows the second.
        mac.update(&[0]);
        mac.update(policy.name.as_str().as_bytes());
        mac.update(&[0]);
        mac.update(subject.as_str().as_bytes());
        let full = mac.finalize().into_bytes();
        let mut tag = [0; TAG_BYTES];
        tag.copy_from_slice(&full[..TAG_BYTES]);
        tag
    }

    /// A ticket as [`Ticket`]'s `Display` wrote it (its tag not checked: [`Keyring::verify`]),
    /// or why it is not one.
    fn parse(s: &str) -> Result<Self, &'static str> {
        if s.len() > MAX_TICKET_BYTES {
            return Err(MALFORMED);
        }
        let (body, tag_hex) = s.rsplit_once('.').ok_or(MALFORMED)?;
        let mut tag = [0; TAG_BYTES];
        if tag_hex.len() != 2 * TAG_BYTES {
            return Err(MALFORMED);
        }
        for (i, b) in tag.iter_mut().enumerate() {
            *b = tag_hex
                .get(2 * i..2 * i + 2)
                .filter(|h| {
                    h.bytes()
                        .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(&c))
                })
                .and_then(|h| u8::from_str_radix(h, 16).ok())
                .ok_or(MALFORMED)?;
        }
        let mut fields = body.split('.');
        let v2 = match fields.next() {
            Some(VERSION) => false,
            Some(VERSION_2) => true,
            _ => return Err(MALFORMED),
        };
        let key_id = fields
            .next()
            .and_then(|k| k.parse::<u32>().ok())
            .ok_or(MALFORMED)?;
        let id = fields
            .next()
            .filter(|d| d.len() == 16)
            .and_then(|d| u64::from_str_radix(d, 16).ok())
            .ok_or(MALFORMED)?;
        let units = fields
            .next()
            .and_then(|u| u.parse::<u64>().ok())
            .filter(|u| *u > 0)
            .ok_or(MALFORMED)?;
        // Version 2 kept no take time: its takes count as before any life began.
        let taken_us = if v2 {
            0
        } else {
            fields
                .next()
                .and_then(|t| t.parse::<u64>().ok())
                .ok_or(MALFORMED)?
        };
        let number = |s: &str| s.parse::<u64>().map_err(|_| MALFORMED);
        let mut marks = [Mark::default(); MAX_LIMITS];
        let mut len = 0;
        for field in fields {
            let (at, refunded) = match field.split_once('-') {
                // A count is written only when it is not 0, so a text has one spelling.
                Some((at, count)) if !v2 => (number(at)?, number(count).and_then(nonzero)?),
                Some(_) => return Err(MALFORMED),
                None => (number(field)?, 0),
            };
            *marks.get_mut(len).ok_or(MALFORMED)? = Mark {
                at,
                taken_us,
                refunded,
            };
            len += 1;
        }
        if len == 0 {
            return Err(MALFORMED);
        }
        Ok(Self {
            units,
            key_id,
            id,
            v2,
            marks,
            len,
            tag,
        })
    }

    /// The marks a refund applies it with: one per limit of `policy`, or, when the policy's
    /// limits have changed in number since the ticket was issued, marks that no take holds, so
    /// that the refund gives nothing back (a changed policy ends every ticket).
    pub fn marks_for(&self, policy: &Policy) -> ([Mark; MAX_LIMITS], usize) {
        let n = policy.params().len().min(MAX_LIMITS);
        if self.len == n {
            (self.marks, n)
        } else {
            ([Mark::default(); MAX_LIMITS], n)
        }
    }

    /// The latest of its marks: after it, no limit gives anything back with it, so its record
    /// need not outlive it ([`crate::limiter::ticket_life_end`] reads a mark).
    pub fn ends_at(&self) -> u64 {
        self.marks[..self.len]
            .iter()
            .map(|m| crate::limiter::mark_life_end(m.at))
            .max()
            .unwrap_or(0)
    }
}

/// `n` if it is not 0.
fn nonzero(n: u64) -> Result<u64, &'static str> {
    if n == 0 {
        Err(MALFORMED)
    } else {
        Ok(n)
    }
}

/// `bytes` in lower-case hex, written into `out` (twice as long).
fn hex<'a>(bytes: &[u8], out: &'a mut [u8]) -> &'a str {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for (pair, b) in out.chunks_exact_mut(2).zip(bytes) {
        pair[0] = DIGITS[usize::from(b >> 4)];
        pair[1] = DIGITS[usize::from(b & 0xf)];
    }
    std::str::from_utf8(&out[..2 * bytes.len()]).unwrap_or_default()
}

impl fmt::Display for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut tag = [0; 2 * TAG_BYTES];
        self.write_body(f)?;
        f.write_str(".")?;
        f.write_str(hex(&self.tag, &mut tag))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::{Decision, Verdict};
    use crate::policy::{Algorithm, FailMode, PolicyName};

    fn policy(name: &str) -> Policy {
        let name = PolicyName::parse(name).expect("valid");
        Policy::single(
            name,
            Algorithm::FixedWindow,
            &[5, 1_000],
            None,
            FailMode::Open,
        )
    }

    fn key(k: &str) -> LimitKey {
        LimitKey::parse(k.into()).expect("valid")
    }

    fn verdict() -> Verdict {
        let mut v = Verdict::at(1_000_000);
        v.push(Decision {
            allowed: true,
            remaining: 3,
            reset_after_us: 250,
            retry_after_us: 0,
        });
        v
    }

    fn ring() -> Keyring {
        Keyring::of(Key::new(7, [9; KEY_BYTES]))
    }

    #[test]
    fn a_ticket_reads_back_as_issued_for_its_subject_only() {
        let (r, p) = (ring(), policy("p"));
        let t = r
            .issue(&p, &key("k"), 2, &verdict(), 0xabc)
            .expect("loaded");
        let text = t.to_string();
        assert!(
            text.starts_with("3.7.0000000000000abc.2.1000000.1000250."),
            "{text}"
        );
        // The tag is HMAC-SHA256 of the body, the policy and the key, cut to 128 bits.
        let (body, tag) = text.rsplit_once('.').expect("a tag");
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&[9; KEY_BYTES]).expect("any length");
        mac.update(format!("{body}\0p\0k").as_bytes());
        let mut expected = [0; 2 * TAG_BYTES];
        let full = mac.finalize().into_bytes();
        assert_eq!(tag, hex(&full[..TAG_BYTES], &mut expected));
        let back = r.verify(&text, &p, &key("k")).expect("verifies");
        assert_eq!(back, t);
        assert_eq!(back.marks_for(&p), (t.marks, 1));
        assert_eq!(r.verify(&text, &p, &key("k2")), Err(FORGED));
        assert_eq!(r.verify(&text, &policy("q"), &key("k")), Err(FORGED));
    }

    #[test]
    fn an_altered_field_or_another_key_does_not_verify() {
        let (r, p) = (ring(), policy("p"));
        let text = r
            .issue(&p, &key("k"), 2, &verdict(), 1)
            .expect("loaded")
            .to_string();
        for (from, to) in [
            (".2.1000000.", ".3.1000000."),
            (".1000000.", ".1000001."),
            (".1000250.", ".1000251."),
            (".1000250.", ".1000250-1."),
            ("0001.", "0002."),
        ] {
            let altered = text.replacen(from, to, 1);
            assert_ne!(altered, text);
            assert_eq!(r.verify(&altered, &p, &key("k")), Err(FORGED), "{altered}");
        }
        let other = Keyring::of(Key::new(7, [8; KEY_BYTES]));
        assert_eq!(other.verify(&text, &p, &key("k")), Err(FORGED));
        let rotated_out = Keyring::of(Key::new(9, [9; KEY_BYTES]));
        assert_eq!(rotated_out.verify(&text, &p, &key("k")), Err(UNKNOWN_KEY));
    }

    #[test]
    fn a_rotation_keeps_the_previous_key_verifying_and_signs_with_the_new_one() {
        let (r, p) = (ring(), policy("p"));
        let old = r
            .issue(&p, &key("k"), 2, &verdict(), 1)
            .expect("loaded")
            .to_string();
        let text = rotated(Some(&Key::new(7, [9; KEY_BYTES]).text()), [5; KEY_BYTES]);
        r.load(&text).expect("a ring");
        assert_eq!(r.current_id(), Some(8));
        assert!(r.verify(&old, &p, &key("k")).is_ok());
        let new = r
            .issue(&p, &key("k"), 2, &verdict(), 2)
            .expect("loaded")
            .to_string();
        assert!(new.starts_with("3.8."), "{new}");
        // A second rotation drops key 7.
        r.load(&rotated(Some(&text), [4; KEY_BYTES]))
            .expect("a ring");
        assert_eq!(r.verify(&old, &p, &key("k")), Err(UNKNOWN_KEY));
        assert!(r.verify(&new, &p, &key("k")).is_ok());
        assert_eq!(
            rotated(None, [1; KEY_BYTES]).split_once(':').map(|s| s.0),
            Some("1")
        );
    }

    #[test]
    fn each_limit_keeps_its_refund_count_and_the_take_its_time() {
        let (r, p) = (ring(), policy("p"));
        let mut v = verdict();
        v.refunded[0] = 42;
        v.taken_us = 1_000_100;
        let t = r.issue(&p, &key("k"), 2, &v, 1).expect("loaded");
        let text = t.to_string();
        assert!(text.contains(".2.1000100.1000250-42."), "{text}");
        let back = r.verify(&text, &p, &key("k")).expect("verifies");
        assert_eq!(back.marks_for(&p).0[0], Mark::new(1_000_250, 1_000_100, 42));
    }

    #[test]
    fn a_ticket_of_version_2_still_verifies_as_taken_before_any_life() {
        let (p, k) = (policy("p"), key("k"));
        let body = "2.7.0000000000000001.2.1000250";
        let mut mac = <HmacSha256 as Mac>::new_from_slice(&[9; KEY_BYTES]).expect("any length");
        mac.update(format!("{body}\0p\0k").as_bytes());
        let full = mac.finalize().into_bytes();
        let mut tag = [0; 2 * TAG_BYTES];
        let text = format!("{body}.{}", hex(&full[..TAG_BYTES], &mut tag));
        let t = ring().verify(&text, &p, &k).expect("verifies");
        assert_eq!(t.marks_for(&p).0[0], Mark::new(1_000_250, 0, 0));
        assert_eq!(t.to_string(), text, "written back as it was signed");
        // A count in a version 2 ticket is not one it could hold.
        let counted = text.replacen(".1000250.", ".1000250-1.", 1);
        assert_eq!(ring().verify(&counted, &p, &k), Err(MALFORMED));
    }

    #[test]
    fn a_policy_with_another_number_of_limits_gets_marks_no_take_holds() {
        let p = policy("p");
        let t = Ticket::parse(&format!("2.1.0000000000000001.2.5.6.{}", "0".repeat(32)))
            .expect("parses");
        assert_eq!(t.marks_for(&p), ([Mark::default(); MAX_LIMITS], 1));
    }

    #[test]
    fn anything_else_is_refused() {
        let tag = "0".repeat(32);
        for bad in [
            String::new(),
            "2".into(),
            format!("1.1.00000000.5.{tag}"),
            format!("2.1.0000000000000001.0.5.{tag}"),
            format!("2.1.000000000000001.1.5.{tag}"),
            format!("2.1.0000000000000001.1.{tag}"),
            format!("2.1.0000000000000001.1.x.{tag}"),
            format!("2.1.0000000000000001.1.5.{}", "0".repeat(31)),
            format!("2.1.0000000000000001.1.5.{}", "A".repeat(32)),
            format!("2.x.0000000000000001.1.5.{tag}"),
            format!("2.1.0000000000000001.1.1.2.3.4.5.6.7.8.9.{tag}"),
            format!("3.1.0000000000000001.1.9.1.2.3.4.5.6.7.8.9.{tag}"),
            format!("3.1.0000000000000001.1.9.{tag}"),
            format!("3.1.0000000000000001.1.9.5-0.{tag}"),
            format!("3.1.0000000000000001.1.9.5-x.{tag}"),
            format!("3.1.0000000000000001.1.9.5-1-2.{tag}"),
            format!("4.1.0000000000000001.1.9.5.{tag}"),
            "1".repeat(MAX_TICKET_BYTES + 1),
        ] {
            assert!(Ticket::parse(&bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_padded_key_is_the_same_hmac_key() {
        let k = Key::new(1, [0x42; KEY_BYTES]);
        let mut sliced =
            <HmacSha256 as Mac>::new_from_slice(&[0x42; KEY_BYTES]).expect("any length");
        let mut padded = k.mac();
        sliced.update(b"body");
        padded.update(b"body");
        assert_eq!(
            sliced.finalize().into_bytes(),
            padded.finalize().into_bytes()
        );
    }

    #[test]
    fn a_ring_text_reads_back() {
        let r = Keyring::default();
        assert!(!r.is_loaded());
        assert!(r.load("junk").is_err());
        assert!(r.load("1:00 2:00").is_err());
        let k = Key::new(3, [0xab; KEY_BYTES]);
        r.load(&Keyring::text_of(&k)).expect("a ring");
        assert!(r.knows(3) && !r.knows(2));
    }
}
