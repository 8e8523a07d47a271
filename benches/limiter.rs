//! Decisions per second of each pure limiter function on one core: the embedded store's
//! ceiling before locking and HTTP, and the Lua scripts' Rust twins.
//!
//!     cargo bench --bench limiter

use criterion::{black_box, criterion_group, criterion_main, BatchSize, Criterion};
use ratelimiter::limiter::{
    fixed_window, gcra, sliding_window_counter, sliding_window_log, token_bucket,
};

const NOW: u64 = 1_764_460_800_123_457;

fn decisions(c: &mut Criterion) {
    let mut group = c.benchmark_group("acquire");

    let p = fixed_window::Params::every(1_000_000_000, 60_000_000);
    let state = fixed_window::acquire(None, &p, 1, NOW).state;
    group.bench_function("fixed_window", |b| {
        b.iter(|| fixed_window::acquire(black_box(state), &p, 1, black_box(NOW + 1)))
    });

    let p = sliding_window_counter::Params {
        limit: 1_000_000_000,
        window_us: 60_000_000,
    };
    let state = sliding_window_counter::acquire(None, &p, 1, NOW).state;
    group.bench_function("sliding_window_counter", |b| {
        b.iter(|| sliding_window_counter::acquire(black_box(state), &p, 1, black_box(NOW + 1)))
    });

    let p = token_bucket::Params::new(1_000, 10, 1_000_000);
    let state = token_bucket::acquire(None, &p, 1, NOW).state;
    group.bench_function("token_bucket", |b| {
        b.iter(|| token_bucket::acquire(black_box(state), &p, 1, black_box(NOW + 7)))
    });

    // The same rate as the token bucket above, with a fractional interval (a tenth of a second
    // is whole, so 7 per second exercises the exact fraction).
    let p = gcra::Params::parse(7, 1_000, 1_000).expect("in range");
    let state = gcra::acquire(None, &p, 1, NOW).state;
    group.bench_function("gcra", |b| {
        b.iter(|| gcra::acquire(black_box(state), &p, 1, black_box(NOW + 7)))
    });

    // A log of 100 entries: the state is moved in and out, as the embedded store does.
    let p = sliding_window_log::Params {
        limit: 10_000,
        window_us: 60_000_000,
    };
    let mut log = None;
    for i in 0..100 {
        log = sliding_window_log::acquire(log, &p, 1, NOW + i).state;
    }
    group.bench_function("sliding_window_log", |b| {
        b.iter_batched(
            || log.clone(),
            |state| sliding_window_log::acquire(state, &p, 1, black_box(NOW + 1_000)),
            BatchSize::SmallInput,
        )
    });
    group.finish();
}

/// The boundaries of a calendar period (issue 28), which a calendar limit computes for every
/// decision before its script runs (`period`, twice: this period and the next, in
/// `params_at`): a day and a month in a zone with daylight saving, and a day in UTC. Beside
/// them, `params_at` of an epoch window, the cost every other limit pays for the same step.
fn calendar_periods(c: &mut Criterion) {
    use ratelimiter::limiter::calendar::period;
    use ratelimiter::policy::calendar::Calendar;
    use ratelimiter::policy::{Algorithm, Limit, PolicyName};
    use serde_json::json;

    fn limit_name(l: &Limit) -> String {
        let c = l.calendar_of().expect("a calendar limit");
        format!(
            "{}_{}",
            c.unit().as_str(),
            c.zone().name().replace('/', "_")
        )
    }

    let mut group = c.benchmark_group("calendar_period");
    let now = i64::try_from(NOW).expect("fits");
    for (name, calendar) in [
        ("day_utc", json!({"unit": "day", "time_zone": "UTC"})),
        (
            "day_berlin",
            json!({"unit": "day", "time_zone": "Europe/Berlin"}),
        ),
        (
            "month_31_new_york",
            json!({"unit": "month", "time_zone": "America/New_York", "month_day": 31}),
        ),
    ] {
        let calendar = Calendar::parse(&calendar).expect("a valid calendar");
        group.bench_function(name, |b| b.iter(|| period(&calendar, black_box(now + 7))));
        let name = PolicyName::parse("p").expect("a name");
        let limit = Limit::calendar(name, 100, calendar);
        group.bench_function(format!("params_at_{}", limit_name(&limit)), |b| {
            b.iter(|| limit.params_at(black_box(NOW + 7)))
        });
    }
    let epoch = Limit::new(
        PolicyName::parse("p").expect("a name"),
        Algorithm::FixedWindow,
        &[100, 86_400_000],
    );
    group.bench_function("params_at_epoch_window", |b| {
        b.iter(|| epoch.params_at(black_box(NOW + 7)))
    });
    group.finish();
}

criterion_group!(benches, decisions, calendar_periods);
criterion_main!(benches);
