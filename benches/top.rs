//! The cost of counting one decision for the top offenders (`service::top`), the work an
//! acquire adds under its policy's lock: a subject already tracked (no allocation), and a flood
//! of subjects never seen before (each evicts the smallest count), at the default capacity and
//! the largest (256).

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use ratelimiter::config::TopSettings;
use ratelimiter::service::top::summary::{KeyHasher, Summary};
use ratelimiter::service::top::{Counted, Top};

fn record(c: &mut Criterion) {
    let mut group = c.benchmark_group("top_record");
    for capacity in [128usize, 256] {
        let hasher = KeyHasher::default();
        let keys: Vec<String> = (0..capacity / 2).map(|i| format!("user-{i:08}")).collect();
        let mut s = Summary::new(capacity);
        for k in &keys {
            s.add(hasher.hash(k), k, 1);
        }
        let mut i = 0;
        group.bench_function(BenchmarkId::new("summary_tracked", capacity), |b| {
            b.iter(|| {
                let k = &keys[i % keys.len()];
                i += 1;
                s.add(hasher.hash(k), black_box(k), 1);
            })
        });
        let fresh: Vec<String> = (0..100_000).map(|i| format!("new-{i:08}")).collect();
        let mut full = Summary::new(capacity);
        for k in fresh.iter().take(capacity) {
            full.add(hasher.hash(k), k, 1);
        }
        let mut j = 0;
        group.bench_function(BenchmarkId::new("summary_new_subject", capacity), |b| {
            b.iter(|| {
                let k = &fresh[j % fresh.len()];
                j += 1;
                full.add(hasher.hash(k), black_box(k), 1);
            })
        });
        // The whole of what an acquire does: the registry's shared lock, the policy's lock, one
        // or two summaries.
        let top = Top::new(&TopSettings {
            subjects: capacity,
            ..TopSettings::default()
        });
        let allowed = Counted {
            allowed: true,
            near_limit: false,
        };
        let mut n = 0;
        group.bench_function(BenchmarkId::new("count_tracked", capacity), |b| {
            b.iter(|| {
                let k = &keys[n % keys.len()];
                n += 1;
                top.count("api", black_box(k), allowed);
            })
        });
        let mut m = 0;
        group.bench_function(BenchmarkId::new("count_new_subject", capacity), |b| {
            b.iter(|| {
                let k = &fresh[m % fresh.len()];
                m += 1;
                top.count("api", black_box(k), allowed);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, record);
criterion_main!(benches);
