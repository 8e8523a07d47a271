use std::collections::HashSet;
use std::net::{Ipv4Addr, Ipv6Addr};

use ipnet::{Ipv4Net, Ipv6Net};
use proptest::prelude::*;
use serde_json::json;

use super::*;

fn parse(v: Value) -> Match {
    Match::parse(&v).expect("valid")
}

fn refused(v: Value) -> ValidationError {
    Match::parse(&v).expect_err("should be refused")
}

fn index(matches: &[Value]) -> OverrideIndex<usize> {
    OverrideIndex::new(matches.iter().map(|v| parse(v.clone())).zip(0..)).expect("no conflict")
}

/// The position of the override `find` picks for `key`.
fn found(index: &OverrideIndex<usize>, key: &str) -> Option<usize> {
    index.find(key).map(|(_, v)| *v)
}

#[test]
fn each_form_parses_and_reads_back_as_written() {
    for v in [
        json!({"key": "acme-corp"}),
        json!({"prefix": "acme-"}),
        json!({"cidr": "203.0.113.0/24"}),
        json!({"cidr": "2001:db8::/32"}),
        json!({"cidr": "0.0.0.0/0"}),
        json!({"cidr": "::/0"}),
        json!({"key": "é".repeat(128)}),
        json!({"prefix": "x".repeat(MAX_KEY_BYTES)}),
    ] {
        let m = parse(v.clone());
        assert_eq!(serde_json::to_value(&m).expect("serializes"), v);
        assert_eq!(parse(serde_json::to_value(&m).expect("serializes")), m);
    }
    assert_eq!(
        parse(json!({"key": "a", "prefix": null, "cidr": null})),
        Match::Key(LimitKey::parse("a".into()).expect("valid")),
        "null is absent"
    );
    assert_eq!(
        parse(json!({"cidr": "2001:DB8::/32"})).to_string(),
        "cidr 2001:db8::/32"
    );
}

#[test]
fn every_refusal_names_its_field() {
    let cases = [
        (json!("acme"), "match", true),
        (json!(["acme"]), "match", true),
        (json!({}), "match", false),
        (json!({"key": null}), "match", false),
        (json!({"key": "a", "prefix": "a"}), "match", false),
        (json!({"prefix": "a", "cidr": "10.0.0.0/8"}), "match", false),
        (json!({"key": "a", "colour": "red"}), "match.colour", false),
        (json!({"regex": ".*"}), "match.regex", false),
        (json!({"key": 5}), "match.key", true),
        (json!({"key": ""}), "match.key", false),
        (json!({"key": "é".repeat(129)}), "match.key", false),
        (json!({"prefix": true}), "match.prefix", true),
        (json!({"prefix": ""}), "match.prefix", false),
        (
            json!({"prefix": "x".repeat(MAX_KEY_BYTES + 1)}),
            "match.prefix",
            false,
        ),
        (json!({"cidr": 24}), "match.cidr", true),
        (json!({"cidr": "nonsense"}), "match.cidr", false),
        (json!({"cidr": ""}), "match.cidr", false),
        (json!({"cidr": "203.0.113.7"}), "match.cidr", false),
        (json!({"cidr": "203.0.113.0/33"}), "match.cidr", false),
        (json!({"cidr": "203.0.113.0/"}), "match.cidr", false),
        (json!({"cidr": "203.0.113.7/24"}), "match.cidr", false),
        (json!({"cidr": "2001:db8::1/32"}), "match.cidr", false),
        (json!({"cidr": "2001:db8::/129"}), "match.cidr", false),
        (
            json!({"cidr": "::ffff:203.0.113.0/120"}),
            "match.cidr",
            false,
        ),
        (json!({"cidr": "::ffff:0.0.0.0/96"}), "match.cidr", false),
    ];
    for (v, field, malformed) in cases {
        let e = refused(v.clone());
        assert_eq!(e.field(), Some(field), "{v}: {e}");
        assert_eq!(e.is_malformed(), malformed, "{v}: {e}");
    }
    assert_eq!(
        refused(json!({"cidr": "203.0.113.7/24"})).to_string(),
        "`match.cidr` has host bits set: the range is 203.0.113.0/24; write that, or a `key` for \
         one address"
    );
    assert_eq!(
        refused(json!({"cidr": "::ffff:203.0.113.0/120"})).to_string(),
        "`match.cidr` is IPv4-mapped, and mapped addresses count as IPv4: write 203.0.113.0/24"
    );
    // Wider than the mapped block is an IPv6 range like any other (it matches no mapped address).
    assert!(Match::parse(&json!({"cidr": "::/64"})).is_ok());
}

#[test]
fn an_exact_key_beats_every_pattern() {
    let i = index(&[
        json!({"prefix": "10."}),
        json!({"cidr": "10.0.0.0/8"}),
        json!({"key": "10.0.0.1"}),
        json!({"cidr": "10.0.0.1/32"}),
        json!({"prefix": "10.0.0.1"}),
    ]);
    assert_eq!(found(&i, "10.0.0.1"), Some(2));
    assert_eq!(found(&i, "10.0.0.2"), Some(1));
    let candidates: Vec<usize> = i.candidates("10.0.0.1").iter().map(|(_, v)| **v).collect();
    assert_eq!(candidates, [2, 3, 1, 4, 0], "in precedence order");
}

#[test]
fn exact_keys_are_found_whether_held_inline_or_not() {
    // Around the length the table holds inline, and keys whose last byte is inside a character.
    let keys: Vec<String> = [1, 21, 22, 23, 64, MAX_KEY_BYTES]
        .iter()
        .map(|n| "k".repeat(*n))
        .chain([
            "é".repeat(11),
            format!("a{}", "é".repeat(11)),
            "€".repeat(8),
        ])
        .collect();
    let i = index(&keys.iter().map(|k| json!({ "key": k })).collect::<Vec<_>>());
    for (at, k) in keys.iter().enumerate() {
        assert_eq!(found(&i, k), Some(at), "{k}");
        assert_eq!(i.find_where(k, |_| true), Some(&at), "{k}");
        assert_eq!(
            i.get(&Match::Key(LimitKey::parse(k.clone()).unwrap())),
            Some(&at),
            "{k}"
        );
        let shorter = &k[..k.char_indices().last().map_or(0, |(i, _)| i)];
        if !keys.iter().any(|other| other == shorter) {
            assert_eq!(found(&i, shorter), None, "{shorter:?} is no key");
        }
        assert_eq!(found(&i, &format!("{k}x")), None);
    }
}

#[test]
fn the_longest_prefix_wins() {
    let i = index(&[
        json!({"prefix": "acme-"}),
        json!({"prefix": "acme-eu-"}),
        json!({"prefix": "a"}),
        json!({"prefix": "é"}),
    ]);
    assert_eq!(found(&i, "acme-eu-1"), Some(1));
    assert_eq!(found(&i, "acme-us-1"), Some(0));
    assert_eq!(found(&i, "acme-"), Some(0));
    assert_eq!(found(&i, "acme"), Some(2));
    assert_eq!(found(&i, "béta"), None);
    assert_eq!(found(&i, "éa"), Some(3));
    assert_eq!(found(&i, ""), None);
    assert_eq!(
        found(&i, "Acme-"),
        None,
        "bytes, not letters regardless of case"
    );
}

#[test]
fn the_narrowest_range_wins_and_a_range_beats_a_prefix() {
    let i = index(&[
        json!({"cidr": "203.0.0.0/16"}),
        json!({"cidr": "203.0.113.0/24"}),
        json!({"prefix": "203.0.113."}),
        json!({"cidr": "2001:db8::/32"}),
        json!({"cidr": "2001:db8:1::/48"}),
        json!({"prefix": "2001:"}),
    ]);
    assert_eq!(found(&i, "203.0.113.7"), Some(1));
    assert_eq!(found(&i, "203.0.7.7"), Some(0));
    assert_eq!(found(&i, "203.1.113.7"), None);
    assert_eq!(found(&i, "2001:db8:1::7"), Some(4));
    assert_eq!(found(&i, "2001:db8:2::7"), Some(3));
    // The same address, spelt otherwise: the range still applies, the prefix never would.
    assert_eq!(found(&i, "2001:DB8:1:0:0:0:0:7"), Some(4));
    assert_eq!(found(&i, "2001:0db8:0001::7"), Some(4));
    // Not an address: ranges do not apply, and the prefix does.
    assert_eq!(found(&i, "2001:db8:1::7x"), Some(5));
    assert_eq!(found(&i, "203.0.113.7:443"), Some(2));
    assert_eq!(
        found(&i, "203.0.113.07"),
        Some(2),
        "leading zeros are not an address"
    );
}

#[test]
fn ipv4_mapped_addresses_count_as_ipv4() {
    let i = index(&[json!({"cidr": "203.0.113.0/24"}), json!({"cidr": "::/0"})]);
    assert_eq!(found(&i, "::ffff:203.0.113.7"), Some(0));
    assert_eq!(found(&i, "::FFFF:203.0.113.7"), Some(0));
    assert_eq!(found(&i, "::ffff:cb00:7107"), Some(0));
    assert_eq!(
        found(&i, "::ffff:198.51.100.1"),
        None,
        "an IPv6 range never matches one"
    );
    assert_eq!(found(&i, "2001:db8::1"), Some(1));
    assert_eq!(found(&i, "::1"), Some(1));
    // The deprecated IPv4-compatible form is an IPv6 address.
    assert_eq!(found(&i, "::203.0.113.7"), Some(1));
    assert_eq!(
        address("::ffff:203.0.113.7"),
        Some(IpAddr::V4(Ipv4Addr::new(203, 0, 113, 7)))
    );
    assert_eq!(address("acme"), None);
    assert_eq!(address(""), None);
    assert_eq!(address("[::1]"), None);
}

#[test]
fn identical_matches_conflict_and_are_refused() {
    let a = parse(json!({"prefix": "acme-"}));
    assert!(a.conflicts(&a.clone()));
    assert!(!a.conflicts(&parse(json!({"key": "acme-"}))));
    assert!(!a.conflicts(&parse(json!({"prefix": "acme-eu"}))));
    assert!(
        parse(json!({"cidr": "2001:DB8::/32"})).conflicts(&parse(json!({"cidr": "2001:db8::/32"})))
    );
    let mut i = index(&[
        json!({"key": "k"}),
        json!({"prefix": "acme-"}),
        json!({"cidr": "10.0.0.0/8"}),
        json!({"cidr": "2001:db8::/32"}),
    ]);
    for (v, with) in [
        (json!({"key": "k"}), 0),
        (json!({"prefix": "acme-"}), 1),
        (json!({"cidr": "10.0.0.0/8"}), 2),
        (json!({"cidr": "2001:db8::/32"}), 3),
    ] {
        assert_eq!(i.get(&parse(v.clone())), Some(&with));
        assert_eq!(i.insert(parse(v.clone()), 9), Err(Conflict { with }), "{v}");
    }
    assert_eq!(i.len(), 4, "nothing was added");
    assert_eq!(i.get(&parse(json!({"cidr": "10.0.0.0/9"}))), None);
    assert_eq!(
        OverrideIndex::new([(a.clone(), 0), (parse(json!({"key": "x"})), 1), (a, 2)]).err(),
        Some((2, Conflict { with: 0 }))
    );
}

#[test]
fn counts_are_by_kind() {
    let i = index(&[
        json!({"key": "a"}),
        json!({"key": "b"}),
        json!({"prefix": "a"}),
        json!({"cidr": "10.0.0.0/8"}),
        json!({"cidr": "::/0"}),
    ]);
    assert_eq!(
        i.counts(),
        Counts {
            exact: 2,
            prefix: 1,
            cidr: 2
        }
    );
    assert_eq!(
        (i.len(), i.counts().patterns(), i.is_empty()),
        (5, 3, false)
    );
    let kinds: Vec<&str> = i.iter().map(|(m, _)| m.kind().as_str()).collect();
    assert_eq!(kinds, ["exact", "exact", "prefix", "cidr", "cidr"]);
    let empty = OverrideIndex::<()>::default();
    assert!(empty.is_empty() && empty.find("a").is_none() && empty.find("10.0.0.1").is_none());
}

// Random matches and keys drawn from small pools, so that they overlap often.

fn v4() -> impl Strategy<Value = Ipv4Addr> {
    prop_oneof![
        4 => (0u32..0x400).prop_map(|r| Ipv4Addr::from(0x0a00_0000 | r)),
        1 => any::<u32>().prop_map(Ipv4Addr::from),
    ]
}

fn v6() -> impl Strategy<Value = Ipv6Addr> {
    prop_oneof![
        4 => (0u128..0x400).prop_map(|r| Ipv6Addr::from((0x2001_0db8_u128 << 96) | r)),
        1 => any::<u128>().prop_map(Ipv6Addr::from),
    ]
}

fn full_form(a: Ipv6Addr) -> String {
    let segments: Vec<String> = a.segments().iter().map(|s| format!("{s:X}")).collect();
    segments.join(":")
}

fn key_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ab1.:-]{1,6}",
        v4().prop_map(|a| a.to_string()),
        v4().prop_map(|a| format!("::ffff:{a}")),
        v6().prop_map(|a| a.to_string()),
        v6().prop_map(full_form),
    ]
}

fn v4_net(a: Ipv4Addr, len: u8) -> Match {
    Match::Cidr(IpNet::V4(
        Ipv4Net::new(a, len).expect("length in range").trunc(),
    ))
}

fn a_match() -> impl Strategy<Value = Match> {
    prop_oneof![
        key_text().prop_map(|k| Match::Key(LimitKey::parse(k).expect("non-empty"))),
        (key_text(), any::<prop::sample::Index>())
            .prop_map(|(k, i)| Match::Prefix(k[..1 + i.index(k.len())].to_owned())),
        (v4(), prop_oneof![0u8..=32, 20u8..=32]).prop_map(|(a, len)| v4_net(a, len)),
        (v6(), prop_oneof![0u8..=128, 116u8..=128]).prop_filter_map("IPv4-mapped", |(a, len)| {
            Match::parse(&json!({"cidr": format!("{a}/{len}")})).ok()
        }),
    ]
}

/// Keys a match is about: those it matches at its edges, and their other spellings.
fn keys_of(m: &Match) -> Vec<String> {
    match m {
        Match::Key(k) => vec![k.as_str().to_owned()],
        Match::Prefix(p) => {
            let shorter = p.get(..p.len() - 1).unwrap_or_default().to_owned();
            vec![p.clone(), format!("{p}x"), shorter]
        }
        Match::Cidr(IpNet::V4(n)) => {
            let (first, last) = (n.network(), n.broadcast());
            vec![
                first.to_string(),
                last.to_string(),
                format!("::ffff:{first}"),
            ]
        }
        Match::Cidr(IpNet::V6(n)) => vec![
            n.network().to_string(),
            n.broadcast().to_string(),
            full_form(n.network()),
        ],
    }
}

/// The reference: every match tried, the one of highest precedence chosen. Panics if two of the
/// highest precedence match, which the index's refusal of conflicts must make impossible.
fn naive(matches: &[Match], key: &str) -> Vec<usize> {
    let mut hits: Vec<usize> = (0..matches.len())
        .filter(|&i| matches[i].matches(key))
        .collect();
    hits.sort_by_key(|&i| std::cmp::Reverse(matches[i].precedence()));
    for pair in hits.windows(2) {
        assert_ne!(
            matches[pair[0]].precedence(),
            matches[pair[1]].precedence(),
            "{} and {} both match {key:?} with equal precedence",
            matches[pair[0]],
            matches[pair[1]],
        );
    }
    hits
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn find_is_the_naive_scan_by_precedence(
        drawn in prop::collection::vec(a_match(), 0..40),
        extra in prop::collection::vec(key_text(), 0..20),
    ) {
        let mut seen = HashSet::new();
        let matches: Vec<Match> = drawn.into_iter().filter(|m| seen.insert(m.clone())).collect();
        let index = OverrideIndex::new(matches.iter().cloned().zip(0..)).expect("no duplicates");
        prop_assert_eq!(index.len(), matches.len());
        let keys = extra.into_iter().chain(matches.iter().flat_map(keys_of));
        for key in keys {
            let expected = naive(&matches, &key);
            prop_assert_eq!(found(&index, &key), expected.first().copied(), "{:?}", key);
            let candidates: Vec<usize> =
                index.candidates(&key).iter().map(|(_, v)| **v).collect();
            prop_assert_eq!(candidates, expected, "{:?}", key);
            if let Some((m, v)) = index.find(&key) {
                prop_assert_eq!(m, &matches[*v]);
            }
        }
    }

    #[test]
    fn removals_and_expired_overrides_give_way_to_the_next_by_precedence(
        drawn in prop::collection::vec(a_match(), 0..40),
        removed in prop::collection::vec(any::<bool>(), 40),
        dead in prop::collection::vec(any::<bool>(), 40),
        extra in prop::collection::vec(key_text(), 0..20),
    ) {
        let mut seen = HashSet::new();
        let matches: Vec<Match> = drawn.into_iter().filter(|m| seen.insert(m.clone())).collect();
        let mut index = OverrideIndex::new(matches.iter().cloned().zip(0..)).expect("no duplicates");
        for (i, m) in matches.iter().enumerate() {
            if removed[i] {
                prop_assert_eq!(index.remove(m), Some(i));
                prop_assert_eq!(index.remove(m), None);
            }
        }
        prop_assert_eq!(index.len(), removed[..matches.len()].iter().filter(|r| !**r).count());
        // Removed positions are taken again by later insertions, which find them as any other.
        let mut reinserted = index.clone();
        for (i, m) in matches.iter().enumerate().filter(|(i, _)| removed[*i]) {
            prop_assert!(reinserted.insert(m.clone(), i).is_ok());
        }
        let keys: Vec<String> = extra.into_iter().chain(matches.iter().flat_map(keys_of)).collect();
        for key in &keys {
            let expected: Vec<usize> = naive(&matches, key)
                .into_iter()
                .filter(|i| !removed[*i] && !dead[*i])
                .collect();
            let got = index.find_where(key, |v| !dead[*v]).copied();
            prop_assert_eq!(got, expected.first().copied(), "{:?}", key);
            let all = naive(&matches, key);
            prop_assert_eq!(reinserted.find(key).map(|(_, v)| *v), all.first().copied(), "{:?}", key);
        }
    }

    #[test]
    fn matches_of_equal_precedence_never_share_a_key_unless_identical(
        a in a_match(),
        b in a_match(),
        extra in prop::collection::vec(key_text(), 0..10),
        bits in any::<u128>(),
    ) {
        // Give `b` the precedence of `a`, keeping its text or address: the hard case.
        let b = match (&a, b) {
            (Match::Key(_), b) => Match::Key(LimitKey::parse(keys_of(&b).remove(0)).expect("non-empty")),
            (Match::Prefix(p), b) => {
                let mut text = keys_of(&b).remove(0);
                while text.len() < p.len() {
                    text.push('a');
                }
                let mut end = p.len();
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                text.truncate(end);
                text.extend(std::iter::repeat_n('a', p.len() - end));
                Match::Prefix(text)
            }
            (Match::Cidr(IpNet::V4(n)), _) => {
                // Within a few networks of `a`'s, so that neighbours and equals both arise.
                let near = u32::from(n.network()) ^ ((bits as u32 & 3) << (32 - u32::from(n.prefix_len())).min(31));
                v4_net(Ipv4Addr::from(near), n.prefix_len())
            }
            (Match::Cidr(IpNet::V6(n)), _) => {
                let near = u128::from(n.network()) ^ ((bits & 3) << (128 - u32::from(n.prefix_len())).min(127));
                let net = Ipv6Net::new(Ipv6Addr::from(near), n.prefix_len()).expect("in range");
                // A neighbour in the IPv4-mapped block is refused: compare `a` with itself then.
                Match::parse(&json!({"cidr": net.trunc().to_string()})).unwrap_or_else(|_| a.clone())
            }
        };
        prop_assert_eq!(a.precedence(), b.precedence());
        let keys = extra.into_iter().chain(keys_of(&a)).chain(keys_of(&b));
        for key in keys {
            if a.matches(&key) && b.matches(&key) {
                prop_assert!(a.conflicts(&b), "{} and {} both match {:?}", a, b, key);
                prop_assert_eq!(&a, &b);
            }
        }
        prop_assert_eq!(a.conflicts(&b), a == b);
    }
}
