//! The cost of finding the override that applies to a key, on a policy with 100,000 exact keys,
//! 1,000 prefixes and 1,000 address ranges (the scale issue 24 sets): an exact hit, a prefix hit,
//! a range hit, and misses, beside the same lookups on a policy with no overrides; and an exact
//! hit and a miss over every subject in turn, as decisions meet them (the index out of the CPU's
//! cache).
//!
//!     cargo bench --bench overrides

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use ratelimiter::policy::overrides::{Match, OverrideIndex};
use serde_json::json;

fn of(v: serde_json::Value) -> Match {
    Match::parse(&v).expect("valid")
}

/// 100,000 exact keys, 1,000 prefixes of 9 to 24 bytes, and 1,000 distinct ranges: 800 IPv4 of
/// lengths 20 to 32 and 200 IPv6 of lengths 48 to 80, so that a lookup of an address that misses
/// probes every length of its family.
fn full() -> OverrideIndex<u32> {
    let mut matches = Vec::new();
    for i in 0..100_000 {
        matches.push(of(json!({"key": format!("customer-{i}")})));
    }
    for i in 0..1_000 {
        let pad = "x".repeat(i % 14);
        matches.push(of(json!({"prefix": format!("tenant-{i}-{pad}")})));
    }
    for i in 0..800u32 {
        let len = 20 + (i % 13);
        let net = ipnet::Ipv4Net::new(std::net::Ipv4Addr::from(0x0a00_0000 | (i << 12)), len as u8)
            .expect("in range")
            .trunc();
        matches.push(of(json!({"cidr": net.to_string()})));
    }
    for i in 0..200u128 {
        let len = 48 + (i % 33) as u8;
        let net = ipnet::Ipv6Net::new(
            std::net::Ipv6Addr::from((0x2001_0db8_u128 << 96) | (i << 80)),
            len,
        )
        .expect("in range")
        .trunc();
        matches.push(of(json!({"cidr": net.to_string()})));
    }
    let mut seen = std::collections::HashSet::new();
    let matches: Vec<Match> = matches
        .into_iter()
        .filter(|m| seen.insert(m.clone()))
        .collect();
    OverrideIndex::new(matches.into_iter().zip(0..)).expect("no conflicts")
}

/// The 100,000 subjects `<of_key><i>` in a scrambled order (a multiplicative step modulo
/// 100,000), concatenated, with where each ends.
fn spread_keys(of_key: &str) -> (String, Vec<usize>) {
    let mut text = String::new();
    let mut ends = Vec::with_capacity(100_000);
    for n in 0..100_000u64 {
        text.push_str(&format!("{of_key}{}", (n * 7_919) % 100_000));
        ends.push(text.len());
    }
    (text, ends)
}

fn lookups(c: &mut Criterion) {
    let full = full();
    let counts = full.counts();
    assert_eq!(
        (counts.exact, counts.prefix, counts.cidr),
        (100_000, 1_000, 1_000)
    );
    let empty = OverrideIndex::<u32>::default();
    let cases = [
        ("exact_hit", "customer-73911", true),
        ("prefix_hit", "tenant-517-xxxxxxxxxxxxx-user-42", true),
        ("range_hit_v4", "10.7.176.45", true),
        ("range_hit_v6", "2001:db8:7f::1", true),
        ("miss_key", "visitor-8a7f3c", false),
        ("miss_v4", "192.0.2.1", false),
        ("miss_v6", "2001:db9::1", false),
    ];
    let mut group = c.benchmark_group("find");
    for (name, key, hit) in cases {
        assert_eq!(full.find(key).is_some(), hit, "{name}");
        group.bench_function(name, |b| b.iter(|| full.find(black_box(key)).is_some()));
    }
    for (name, key, _) in cases {
        group.bench_function(format!("{name}_no_overrides"), |b| {
            b.iter(|| empty.find(black_box(key)).is_some())
        });
    }
    // A decision's key is a different subject each time: the cases above repeat one key, whose
    // part of the index stays in the CPU's cache, so they show the work and not the memory
    // reads. These draw the key from every subject in a scrambled order (laid out in one buffer,
    // read in order, so that reading the key itself costs what a request's parsed key does).
    for (name, of_key) in [
        ("exact_hit_spread", "customer-"),
        ("miss_key_spread", "visitor-"),
    ] {
        let (text, ends) = spread_keys(of_key);
        let mut at = 0;
        group.bench_function(name, |b| {
            b.iter(|| {
                let start = if at == 0 { 0 } else { ends[at - 1] };
                let key = &text[start..ends[at]];
                at = (at + 1) % ends.len();
                full.find(black_box(key)).is_some()
            })
        });
    }
    group.finish();
}

criterion_group!(benches, lookups);
criterion_main!(benches);
