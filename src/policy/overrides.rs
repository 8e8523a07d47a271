//! What an override applies to (its `match`), and the index that finds the override applying to
//! a subject key.
//!
//! A [`Match`] is one of `{"key": "acme-corp"}` (that subject exactly), `{"prefix": "acme-"}`
//! (every key starting so, compared byte for byte) and `{"cidr": "203.0.113.0/24"}` (every key
//! that is an IPv4 or IPv6 address inside the range). A key is an address when it parses as one
//! (`203.0.113.7`, `2001:db8::1`, any of IPv6's spellings); an IPv4-mapped IPv6 address
//! (`::ffff:203.0.113.7`) is the IPv4 address it maps, so an IPv4 range matches it and no IPv6
//! range does. For the same reason a range inside `::ffff:0:0/96` is refused: it could only ever
//! match through an IPv4 range, which is how it must be written.
//!
//! A `cidr` whose host bits are set (`203.0.113.7/24`) is refused rather than truncated: the
//! operator most likely meant a different range or a single address, and an override read back
//! must be the one that was written.
//!
//! # Precedence
//!
//! When several overrides match one key, exactly one applies, chosen by a fixed rule that does
//! not depend on the order they were written in ([`Precedence`], highest first):
//!
//! 1. an exact `key`;
//! 2. a `cidr`, the narrowest (longest network prefix) first: only for a key that is an address;
//! 3. a `prefix`, the longest first.
//!
//! Ranges beat prefixes because an address's meaning is its range: a range says which networks
//! are meant, whatever the spelling of the address, while a prefix over the text of an address is
//! a coarser tool (`"10.1"` also covers `10.100.0.0/16`, and `2001:db8::1`, `2001:DB8::1` and
//! `2001:db8:0::1` are one address under three prefixes). An operator who wrote a range for an
//! address said the most precise thing there is to say about it short of the key itself.
//!
//! Two matches of equal precedence that could both match one key are identical
//! ([`Match::conflicts`]): two exact keys both match only their own key; two prefixes of one length
//! both match a key only if both are its first bytes; two normalised ranges of one length (and one
//! family, since a key is at most one address) both contain an address only if they are the same
//! network. So refusing identical matches on write (409 naming `match`) is all it takes for
//! resolution never to depend on order; a test checks the claim at random.
//!
//! # Cost
//!
//! [`OverrideIndex::find`] is one hash lookup for exact keys; a walk of a byte trie for prefixes,
//! at most the key's length and usually stopped by the first byte no prefix continues with; and,
//! only when ranges exist and the key parses as an address (once per lookup), one lookup of the
//! masked address per distinct range length of its family, longest first. No regular
//! expressions, and no scan over the patterns.

use std::collections::HashMap;
use std::fmt;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::{IpAddr, Ipv4Addr};

use ipnet::IpNet;
use serde::ser::SerializeMap;
use serde_json::{Map, Value};

mod entry;

pub use entry::{
    parse_override, rfc3339, Override, OverrideDoc, OverrideId, Sets, Written, MAX_EXPIRY_US,
    MAX_REASON_BYTES,
};

use super::input::ValidationError;
use super::name::{LimitKey, MAX_KEY_BYTES};

/// The members of a `match`, exactly one of which it holds.
const MEMBERS: [&str; 3] = ["key", "prefix", "cidr"];

/// What an override applies to: validated, a range normalised (no host bits, never inside the
/// IPv4-mapped block). Two equal matches are the only ones that conflict ([`Match::conflicts`]).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Match {
    /// That subject exactly.
    Key(LimitKey),
    /// Every key whose bytes start with these: 1 to [`MAX_KEY_BYTES`] bytes.
    Prefix(String),
    /// Every key that is an address inside the range.
    Cidr(IpNet),
}

/// A kind of [`Match`], as metrics and caps count them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MatchKind {
    Exact,
    Prefix,
    Cidr,
}

impl MatchKind {
    /// The name used in metrics labels: `exact`, `prefix`, `cidr`.
    pub const fn as_str(self) -> &'static str {
        match self {
            MatchKind::Exact => "exact",
            MatchKind::Prefix => "prefix",
            MatchKind::Cidr => "cidr",
        }
    }
}

/// How strongly a match applies, compared with others matching the same key: greater wins (see
/// the module documentation). Equal precedence and a common key means equal matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Precedence {
    /// A prefix of this many bytes.
    Prefix(usize),
    /// A range of this network prefix length, in its family.
    Cidr(u8),
    /// An exact key.
    Exact,
}

impl Match {
    /// Reads an override's `match`, naming the field at fault (`match`, `match.key`,
    /// `match.prefix`, `match.cidr`). A member that is `null` is absent, as elsewhere.
    pub fn parse(value: &Value) -> Result<Self, ValidationError> {
        let doc: &Map<String, Value> = value.as_object().ok_or(ValidationError::WrongType {
            field: "match".into(),
            expected: "an object with one of `key`, `prefix` or `cidr`",
        })?;
        let mut unknown: Vec<&String> = doc
            .keys()
            .filter(|k| !MEMBERS.contains(&k.as_str()))
            .collect();
        unknown.sort();
        if let Some(k) = unknown.first() {
            return Err(ValidationError::Unknown {
                field: format!("match.{k}"),
            });
        }
        let mut given = MEMBERS
            .iter()
            .filter_map(|m| doc.get(*m).filter(|v| !v.is_null()).map(|v| (*m, v)));
        let (member, value) = match (given.next(), given.next()) {
            (Some(one), None) => one,
            _ => {
                return Err(ValidationError::invalid(
                    "match",
                    "must hold exactly one of `key`, `prefix` or `cidr`",
                ))
            }
        };
        let field = format!("match.{member}");
        let text = value.as_str().ok_or_else(|| ValidationError::WrongType {
            field: field.clone(),
            expected: "a string",
        })?;
        match member {
            "key" => LimitKey::parse(text.to_owned())
                .map(Match::Key)
                .map_err(|r| ValidationError::invalid(&field, r)),
            "prefix" => {
                if text.is_empty() || text.len() > MAX_KEY_BYTES {
                    return Err(ValidationError::invalid(
                        &field,
                        format!("must be 1 to {MAX_KEY_BYTES} bytes"),
                    ));
                }
                Ok(Match::Prefix(text.to_owned()))
            }
            _ => parse_cidr(text).map_err(|r| ValidationError::invalid(&field, r)),
        }
    }

    /// Whether `key` is matched (the reference the index follows; it parses the key each time).
    pub fn matches(&self, key: &str) -> bool {
        match self {
            Match::Key(k) => k.as_str() == key,
            Match::Prefix(p) => key.as_bytes().starts_with(p.as_bytes()),
            Match::Cidr(net) => address(key).is_some_and(|a| net.contains(&a)),
        }
    }

    pub fn kind(&self) -> MatchKind {
        match self {
            Match::Key(_) => MatchKind::Exact,
            Match::Prefix(_) => MatchKind::Prefix,
            Match::Cidr(_) => MatchKind::Cidr,
        }
    }

    pub fn precedence(&self) -> Precedence {
        match self {
            Match::Key(_) => Precedence::Exact,
            Match::Prefix(p) => Precedence::Prefix(p.len()),
            Match::Cidr(net) => Precedence::Cidr(net.prefix_len()),
        }
    }

    /// Whether an override of this match and one of `other` could both apply to one key with
    /// equal precedence, and so must not both exist: exactly when they are equal (see the module
    /// documentation).
    pub fn conflicts(&self, other: &Match) -> bool {
        self == other
    }
}

/// Reads `{"key": …}`, `{"prefix": …}` or `{"cidr": …}` back, as written.
impl serde::Serialize for Match {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(Some(1))?;
        match self {
            Match::Key(k) => map.serialize_entry("key", k.as_str())?,
            Match::Prefix(p) => map.serialize_entry("prefix", p)?,
            Match::Cidr(net) => map.serialize_entry("cidr", &net.to_string())?,
        }
        map.end()
    }
}

impl fmt::Display for Match {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Match::Key(k) => write!(f, "key {:?}", k.as_str()),
            Match::Prefix(p) => write!(f, "prefix {p:?}"),
            Match::Cidr(net) => write!(f, "cidr {net}"),
        }
    }
}

/// The block of IPv4-mapped IPv6 addresses, `::ffff:0:0/96`.
const MAPPED: u128 = 0xffff_0000_0000;

fn parse_cidr(text: &str) -> Result<Match, String> {
    let net: IpNet = text.parse().map_err(|_| {
        "must be an address range with its prefix length, such as 203.0.113.0/24 or \
         2001:db8::/32"
            .to_owned()
    })?;
    if net.trunc() != net {
        return Err(format!(
            "has host bits set: the range is {}; write that, or a `key` for one address",
            net.trunc()
        ));
    }
    if let IpNet::V6(v6) = net {
        if v6.prefix_len() >= 96 && u128::from(v6.network()) >> 32 == MAPPED >> 32 {
            let v4 = Ipv4Addr::from((u128::from(v6.network()) & 0xffff_ffff) as u32);
            return Err(format!(
                "is IPv4-mapped, and mapped addresses count as IPv4: write {v4}/{}",
                v6.prefix_len() - 96
            ));
        }
    }
    Ok(Match::Cidr(net))
}

/// The address `key` is, an IPv4-mapped IPv6 address as its IPv4 address; `None` if it is none.
pub fn address(key: &str) -> Option<IpAddr> {
    // Every address's text starts with a hex digit or ':': most keys are refused at once.
    let first = *key.as_bytes().first()?;
    if !(first.is_ascii_hexdigit() || first == b':') || key.len() > 45 {
        return None;
    }
    match key.parse::<IpAddr>().ok()? {
        IpAddr::V6(v6) => Some(v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)),
        v4 => Some(v4),
    }
}

/// Why an override could not join an index: its match is that of the override at `with`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("`match` is that of override {with} already")]
pub struct Conflict {
    /// The position, in the order they were added, of the override of the same match.
    pub with: usize,
}

/// How many overrides of each kind an index holds, for the caps of a policy.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts {
    pub exact: usize,
    pub prefix: usize,
    pub cidr: usize,
}

impl Counts {
    /// Prefixes and ranges: what a lookup may have to search.
    pub fn patterns(&self) -> usize {
        self.prefix + self.cidr
    }
}

/// The longest exact key [`TableKey`] holds inline.
const INLINE_KEY_BYTES: usize = 22;

/// An exact key as the index's table holds it: up to [`INLINE_KEY_BYTES`] bytes (a customer id,
/// an IPv4 address) in the table's own memory, longer ones on the heap. A lookup compares the
/// key it finds with the one asked for, and at 100,000 keys a key behind a pointer is a likely
/// cache miss on every decision of a subject that has an override.
#[derive(Debug, Clone)]
enum TableKey {
    Inline {
        len: u8,
        bytes: [u8; INLINE_KEY_BYTES],
    },
    Heap(Box<str>),
}

impl TableKey {
    fn new(key: &str) -> Self {
        let mut bytes = [0u8; INLINE_KEY_BYTES];
        match bytes.get_mut(..key.len()) {
            Some(head) => {
                head.copy_from_slice(key.as_bytes());
                TableKey::Inline {
                    len: key.len() as u8,
                    bytes,
                }
            }
            None => TableKey::Heap(key.into()),
        }
    }

    fn as_str(&self) -> &str {
        match self {
            // Always a whole key's bytes: `new` copies them from a `str`.
            TableKey::Inline { len, bytes } => {
                std::str::from_utf8(&bytes[..usize::from(*len)]).unwrap_or_default()
            }
            TableKey::Heap(key) => key,
        }
    }
}

/// Hashed, compared and borrowed as the `str` it holds, so that the table is looked up by `&str`.
impl std::borrow::Borrow<str> for TableKey {
    fn borrow(&self) -> &str {
        self.as_str()
    }
}

impl std::hash::Hash for TableKey {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialEq for TableKey {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for TableKey {}

/// Overrides of one policy by their matches, finding the one that applies to a key by the
/// precedence of the module documentation. Holds no two conflicting matches.
#[derive(Debug, Clone)]
pub struct OverrideIndex<T> {
    /// By position, which everything below refers to them by; a removed override leaves its
    /// position empty until an insertion takes it again ([`OverrideIndex::free`]).
    entries: Vec<Option<(Match, T)>>,
    /// Empty positions.
    free: Vec<usize>,
    /// Exact keys, each with its position and a copy of its value: the lookup of a decision
    /// reads the value from the table's own memory, without a second access to `entries` (at
    /// 100,000 keys, each access is a likely cache miss). Hashed with foldhash, seeded per
    /// table: the keys looked up are a client's, and a fast hash keeps them cheap.
    exact: HashMap<TableKey, (usize, T), foldhash::fast::RandomState>,
    prefixes: Trie,
    v4: Ranges<u32>,
    v6: Ranges<u128>,
    counts: Counts,
}

impl<T> Default for OverrideIndex<T> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            free: Vec::new(),
            exact: HashMap::default(),
            prefixes: Trie::default(),
            v4: Ranges::default(),
            v6: Ranges::default(),
            counts: Counts::default(),
        }
    }
}

impl<T: Clone> OverrideIndex<T> {
    /// An index of `overrides`, or the first that conflicts with an earlier one (its position
    /// and that of the earlier one).
    pub fn new(overrides: impl IntoIterator<Item = (Match, T)>) -> Result<Self, (usize, Conflict)> {
        let mut index = Self::default();
        for (i, (m, value)) in overrides.into_iter().enumerate() {
            index.insert(m, value).map_err(|c| (i, c))?;
        }
        Ok(index)
    }

    /// Adds an override, unless one of a conflicting match is there already.
    pub fn insert(&mut self, m: Match, value: T) -> Result<(), Conflict> {
        if let Some(with) = self.position(&m) {
            return Err(Conflict { with });
        }
        let at = self.free.pop().unwrap_or(self.entries.len());
        match &m {
            Match::Key(k) => {
                self.exact
                    .insert(TableKey::new(k.as_str()), (at, value.clone()));
                self.counts.exact += 1;
            }
            Match::Prefix(p) => {
                self.prefixes.insert(p.as_bytes(), at);
                self.counts.prefix += 1;
            }
            Match::Cidr(IpNet::V4(net)) => {
                self.v4
                    .insert(net.prefix_len(), u32::from(net.network()), at);
                self.counts.cidr += 1;
            }
            Match::Cidr(IpNet::V6(net)) => {
                self.v6
                    .insert(net.prefix_len(), u128::from(net.network()), at);
                self.counts.cidr += 1;
            }
        }
        if at == self.entries.len() {
            self.entries.push(Some((m, value)));
        } else {
            self.entries[at] = Some((m, value));
        }
        Ok(())
    }

    /// Takes out the override whose match is `m`, if there is one.
    pub fn remove(&mut self, m: &Match) -> Option<T> {
        let at = self.position(m)?;
        match m {
            Match::Key(k) => {
                self.exact.remove(k.as_str());
                self.counts.exact -= 1;
            }
            Match::Prefix(p) => {
                self.prefixes.remove(p.as_bytes());
                self.counts.prefix -= 1;
            }
            Match::Cidr(IpNet::V4(net)) => {
                self.v4.remove(net.prefix_len(), u32::from(net.network()));
                self.counts.cidr -= 1;
            }
            Match::Cidr(IpNet::V6(net)) => {
                self.v6.remove(net.prefix_len(), u128::from(net.network()));
                self.counts.cidr -= 1;
            }
        }
        let (_, value) = self.entries[at].take()?;
        self.free.push(at);
        Some(value)
    }

    /// The position of the override whose match conflicts with `m` (is `m`), if there is one.
    fn position(&self, m: &Match) -> Option<usize> {
        match m {
            Match::Key(k) => self.exact.get(k.as_str()).map(|(at, _)| *at),
            Match::Prefix(p) => self.prefixes.get(p.as_bytes()),
            Match::Cidr(IpNet::V4(net)) => self.v4.get(net.prefix_len(), u32::from(net.network())),
            Match::Cidr(IpNet::V6(net)) => self.v6.get(net.prefix_len(), u128::from(net.network())),
        }
    }

    /// The override whose match is `m` (the one a write of `m` would conflict with).
    pub fn get(&self, m: &Match) -> Option<&T> {
        self.position(m).and_then(|i| self.at(i)).map(|(_, v)| v)
    }

    fn at(&self, i: usize) -> Option<(&Match, &T)> {
        self.entries
            .get(i)
            .and_then(Option::as_ref)
            .map(|(m, v)| (m, v))
    }

    /// The override that applies to `key`, by precedence, with its match.
    pub fn find(&self, key: &str) -> Option<(&Match, &T)> {
        let kept = |i: &usize| self.at(*i).is_some();
        let at = self
            .exact
            .get(key)
            .map(|(at, _)| *at)
            .or_else(|| self.range(key, &kept))
            .or_else(|| self.prefixes.longest(key.as_bytes(), &kept))?;
        self.at(at)
    }

    /// The value of the override that applies to `key` among those that `keep` keeps (the live
    /// ones: one that has expired gives way to the next by precedence): a decision's lookup.
    pub fn find_where(&self, key: &str, keep: impl Fn(&T) -> bool) -> Option<&T> {
        if let Some((_, value)) = self.exact.get(key).filter(|(_, v)| keep(v)) {
            return Some(value);
        }
        let kept = |i: &usize| self.at(*i).is_some_and(|(_, v)| keep(v));
        let at = self
            .range(key, &kept)
            .or_else(|| self.prefixes.longest(key.as_bytes(), &kept))?;
        self.at(at).map(|(_, v)| v)
    }

    /// The narrowest range containing `key` that `kept` keeps, when there are ranges and it is
    /// an address.
    fn range(&self, key: &str, kept: &impl Fn(&usize) -> bool) -> Option<usize> {
        if self.v4.is_empty() && self.v6.is_empty() {
            return None;
        }
        match address(key)? {
            IpAddr::V4(a) => self.v4.all(u32::from(a)).find(kept),
            IpAddr::V6(a) => self.v6.all(u128::from(a)).find(kept),
        }
    }

    /// Every override that matches `key`, the one that applies first and then by precedence:
    /// what `resolve` shows. Not for the decision path (it allocates).
    pub fn candidates(&self, key: &str) -> Vec<(&Match, &T)> {
        let mut at: Vec<usize> = Vec::new();
        at.extend(self.exact.get(key).map(|(at, _)| *at));
        match address(key) {
            Some(IpAddr::V4(a)) => at.extend(self.v4.all(u32::from(a))),
            Some(IpAddr::V6(a)) => at.extend(self.v6.all(u128::from(a))),
            None => {}
        }
        at.extend(self.prefixes.all(key.as_bytes()));
        at.into_iter().filter_map(|i| self.at(i)).collect()
    }

    /// The overrides, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = (&Match, &T)> {
        self.entries.iter().flatten().map(|(m, v)| (m, v))
    }

    pub fn len(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How many overrides of each kind there are.
    pub fn counts(&self) -> Counts {
        self.counts
    }
}

/// Prefixes as a byte trie: a lookup walks the key's bytes until no prefix continues with the
/// next, remembering the last prefix ended.
#[derive(Debug, Clone)]
struct Trie {
    /// The root first. Children sorted by byte: a node has at most 256.
    nodes: Vec<Node>,
}

#[derive(Debug, Clone, Default)]
struct Node {
    children: Vec<(u8, u32)>,
    /// The override whose prefix ends here.
    value: Option<usize>,
}

impl Default for Trie {
    fn default() -> Self {
        Self {
            nodes: vec![Node::default()],
        }
    }
}

impl Trie {
    fn child(&self, node: usize, byte: u8) -> Option<usize> {
        let children = &self.nodes[node].children;
        children
            .binary_search_by_key(&byte, |c| c.0)
            .ok()
            .map(|i| children[i].1 as usize)
    }

    fn insert(&mut self, prefix: &[u8], at: usize) {
        let mut node = 0;
        for &b in prefix {
            node = match self.nodes[node].children.binary_search_by_key(&b, |c| c.0) {
                Ok(i) => self.nodes[node].children[i].1 as usize,
                Err(i) => {
                    let next = self.nodes.len();
                    self.nodes.push(Node::default());
                    // At most 100,000 overrides of at most 256 bytes: far below u32::MAX nodes.
                    self.nodes[node].children.insert(i, (b, next as u32));
                    next
                }
            };
        }
        self.nodes[node].value = Some(at);
    }

    /// The nodes passed on the way down `bytes`, as far as they go.
    fn path<'a>(&'a self, bytes: &'a [u8]) -> impl Iterator<Item = &'a Node> + 'a {
        let mut node = Some(0);
        bytes.iter().map_while(move |&b| {
            let next = self.child(node?, b)?;
            node = Some(next);
            Some(&self.nodes[next])
        })
    }

    fn get(&self, prefix: &[u8]) -> Option<usize> {
        let mut node = 0;
        for &b in prefix {
            node = self.child(node, b)?;
        }
        self.nodes[node].value
    }

    /// The longest prefix of `key` that `kept` keeps.
    fn longest(&self, key: &[u8], kept: &impl Fn(&usize) -> bool) -> Option<usize> {
        // The root has no children when there are no prefixes: the walk stops at once.
        self.path(key).filter_map(|n| n.value).filter(kept).last()
    }

    /// Forgets the prefix (its nodes stay, for a prefix written again or a longer one).
    fn remove(&mut self, prefix: &[u8]) {
        let mut node = 0;
        for &b in prefix {
            match self.child(node, b) {
                Some(next) => node = next,
                None => return,
            }
        }
        self.nodes[node].value = None;
    }

    /// Every prefix of `key`, longest first.
    fn all(&self, key: &[u8]) -> Vec<usize> {
        let mut found: Vec<usize> = self.path(key).filter_map(|n| n.value).collect();
        found.reverse();
        found
    }
}

/// An address family's bits, as ranges of it are indexed.
trait Bits: Copy + Eq + std::hash::Hash {
    const WIDTH: u8;
    /// The first `len` bits, shifted down (so that networks of one length differ in their low
    /// bits, as hash tables like).
    fn network(self, len: u8) -> Self;
}

impl Bits for u32 {
    const WIDTH: u8 = 32;
    fn network(self, len: u8) -> Self {
        self.checked_shr(u32::from(Self::WIDTH - len)).unwrap_or(0)
    }
}

impl Bits for u128 {
    const WIDTH: u8 = 128;
    fn network(self, len: u8) -> Self {
        self.checked_shr(u32::from(Self::WIDTH - len)).unwrap_or(0)
    }
}

/// Ranges of one family: per network prefix length, longest first, the masked networks.
#[derive(Debug, Clone)]
struct Ranges<B> {
    by_len: Vec<(u8, Networks<B>)>,
}

/// The networks of one length, by their bits shifted down ([`Bits::network`]).
type Networks<B> = HashMap<B, usize, BuildHasherDefault<NetHasher>>;

impl<B> Default for Ranges<B> {
    fn default() -> Self {
        Self { by_len: Vec::new() }
    }
}

impl<B: Bits> Ranges<B> {
    fn is_empty(&self) -> bool {
        self.by_len.is_empty()
    }

    fn insert(&mut self, len: u8, network: B, at: usize) {
        let i = match self.by_len.binary_search_by(|(l, _)| len.cmp(l)) {
            Ok(i) => i,
            Err(i) => {
                self.by_len.insert(i, (len, HashMap::default()));
                i
            }
        };
        self.by_len[i].1.insert(network.network(len), at);
    }

    fn get(&self, len: u8, network: B) -> Option<usize> {
        let i = self.by_len.binary_search_by(|(l, _)| len.cmp(l)).ok()?;
        self.by_len[i].1.get(&network.network(len)).copied()
    }

    fn remove(&mut self, len: u8, network: B) {
        if let Ok(i) = self.by_len.binary_search_by(|(l, _)| len.cmp(l)) {
            self.by_len[i].1.remove(&network.network(len));
            if self.by_len[i].1.is_empty() {
                self.by_len.remove(i);
            }
        }
    }

    fn all(&self, address: B) -> impl Iterator<Item = usize> + '_ {
        self.by_len
            .iter()
            .filter_map(move |(len, nets)| nets.get(&address.network(*len)).copied())
    }
}

/// A fast hash of the integers of [`Ranges`]: their keys are written by operators, not by
/// clients, so the flooding a keyed hash defends against does not arise, and a lookup per range
/// length must stay cheap.
#[derive(Debug, Clone, Copy, Default)]
struct NetHasher(u64);

impl Hasher for NetHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_u128(&mut self, n: u128) {
        self.write_u64(n as u64);
        self.write_u64((n >> 64) as u64);
    }

    fn finish(&self) -> u64 {
        // The finaliser of MurmurHash3, so that both the high bits (which hashbrown's control
        // bytes take) and the low bits (its bucket) depend on every input bit.
        let mut h = self.0;
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        h
    }
}

#[cfg(test)]
mod tests;
