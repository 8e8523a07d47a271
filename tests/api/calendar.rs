//! Calendar quotas (issue 28) through the HTTP API, on every store, at instants the tests choose:
//! the service's clock is set by hand, and every plan carries that time to the store, so Redis
//! (one server or a Cluster) decides at it too. Each expected reset is computed here on its own,
//! with jiff's calendar arithmetic on the bundled IANA database (the next local midnight, a
//! week's or a month's first day), not with the service's `limiter::calendar`.
//!
//! Redis keeps a state for the time its window has left, on its own clock: an instant chosen a
//! second before a reset would see its state expire while the test still counts on it, so the
//! instants just before a reset are a minute before it.

use jiff::civil::Date;
use jiff::ZonedDateTime;
use serde_json::{json, Value};

use crate::helpers::{spawn_app, Backend, TestApp};
use crate::zoned::{day_us, next_midnight, shown, start_of, us, us_of, zone};

crate::on_every_store!(
    five_a_day_in_berlin_reset_at_the_next_midnight_there_on_dst_days_too,
    a_monthly_quota_anchored_on_the_31st_resets_on_the_last_day_of_shorter_months,
    weeks_quarters_and_years_start_where_their_anchors_say,
    a_calendar_limit_among_others_answers_its_own_reset,
);

async fn acquire(app: &TestApp, policy: &str, key: &str) -> (Value, reqwest::header::HeaderMap) {
    app.acquire_with_headers(policy, key).await
}

fn header(headers: &reqwest::header::HeaderMap, name: &str) -> String {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_owned()
}

/// Spends `limit` units of `key` at `at_us`, then checks the denial that follows: retry and reset
/// exactly until `resets` (its `resets_at` shown as `resets` is), and `RateLimit-Policy`'s `w`
/// the period's length, `period_s`.
async fn spend_then_denied(
    app: &TestApp,
    policy: &str,
    key: &str,
    limit: u64,
    at_us: u64,
    resets: &ZonedDateTime,
    period_s: u64,
) {
    app.limiter.clock().set(at_us);
    let decided_by = |v: &Value| v["decided_by"].as_str().unwrap_or_default().to_owned();
    for i in 0..limit {
        let (v, _) = acquire(app, policy, key).await;
        assert_eq!(v["allowed"], true, "unit {i} of {key}: {v}");
        assert_eq!(v["remaining"], limit - i - 1, "{key}: {v}");
        assert!(
            ["embedded", "redis"].contains(&decided_by(&v).as_str()),
            "{v}"
        );
    }
    let (v, headers) = acquire(app, policy, key).await;
    let until_ms = (us_of(resets) - at_us).div_ceil(1_000);
    assert_eq!(v["allowed"], false, "{key}: {v}");
    assert_eq!(v["retry_after_ms"], until_ms, "{key} at {at_us}: {v}");
    assert_eq!(v["reset_after_ms"], until_ms, "{key}: {v}");
    assert_eq!(v["resets_at"], shown(resets), "{key}: {v}");
    assert_eq!(
        header(&headers, "ratelimit-policy"),
        format!("\"{policy}\";q={limit};w={period_s}"),
        "{key}: {v}"
    );
    assert_eq!(
        header(&headers, "ratelimit"),
        format!("\"{policy}\";r=0;t={}", until_ms.div_ceil(1_000)),
        "{key}"
    );
    // At the reset exactly, the subject has its whole quota again.
    app.limiter.clock().set(us_of(resets));
    let (v, _) = acquire(app, policy, key).await;
    assert_eq!(v["allowed"], true, "{key} at its reset: {v}");
    assert_eq!(v["remaining"], limit - 1, "a new period for {key}: {v}");
}

async fn five_a_day_in_berlin_reset_at_the_next_midnight_there_on_dst_days_too(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_policy(json!({
        "name": "daily-berlin", "algorithm": "fixed_window", "limit": 5,
        "calendar": {"unit": "day", "time_zone": "Europe/Berlin"}
    }))
    .await;
    let berlin = zone("Europe/Berlin");
    let instants = [
        // An ordinary day of 24 hours.
        "2026-12-04T12:00:00+01:00",
        // 29 March 2026: 02:00 became 03:00, a day of 23 hours.
        "2026-03-29T00:00:00+01:00",
        "2026-03-29T01:59:59.999999+01:00",
        "2026-03-29T03:00:00+02:00",
        "2026-03-28T23:59:00+01:00",
        // 25 October 2026: 03:00 became 02:00 again, a day of 25 hours; both 02:30s.
        "2026-10-25T02:30:00+02:00",
        "2026-10-25T02:30:00+01:00",
        "2026-10-25T23:59:00.5+01:00",
        "2026-10-24T23:59:00.001+02:00",
    ];
    let mut lengths = Vec::new();
    for (i, at) in instants.iter().enumerate() {
        let at_us = us(at);
        let (midnight, day) = (next_midnight(at_us, &berlin), day_us(at_us, &berlin));
        lengths.push(day / 3_600_000_000);
        spend_then_denied(
            &app,
            "daily-berlin",
            &format!("subject-{i}"),
            5,
            at_us,
            &midnight,
            day / 1_000_000,
        )
        .await;
    }
    assert_eq!(
        lengths,
        [24, 23, 23, 23, 24, 25, 25, 25, 24],
        "the cases cover days of 23 and 25 hours"
    );
    // Spelled out, as a reader checks them: the offsets change with the season.
    let midnight = next_midnight(us("2026-03-29T12:00:00+02:00"), &berlin);
    assert_eq!(shown(&midnight), "2026-03-30T00:00:00+02:00");
    let midnight = next_midnight(us("2026-10-25T12:00:00+01:00"), &berlin);
    assert_eq!(shown(&midnight), "2026-10-26T00:00:00+01:00");
}

async fn a_monthly_quota_anchored_on_the_31st_resets_on_the_last_day_of_shorter_months(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    // South of the equator, in a zone that abolished daylight saving in 2019.
    app.create_policy(json!({
        "name": "monthly", "algorithm": "fixed_window", "limit": 2,
        "calendar": {"unit": "month", "time_zone": "America/Sao_Paulo", "month_day": 31}
    }))
    .await;
    let tz = zone("America/Sao_Paulo");
    // (instant, the period's first day, its last day + 1 = the reset): the documented rule, a
    // month shorter than the anchor starts its period on its last day.
    let cases = [
        ("2027-01-30T23:59:00-03:00", (2026, 12, 31), (2027, 1, 31)),
        ("2027-01-31T00:00:00-03:00", (2027, 1, 31), (2027, 2, 28)),
        ("2027-02-10T12:00:00-03:00", (2027, 1, 31), (2027, 2, 28)),
        ("2027-02-28T00:00:00-03:00", (2027, 2, 28), (2027, 3, 31)),
        ("2027-04-15T00:00:00-03:00", (2027, 3, 31), (2027, 4, 30)),
        ("2027-04-30T08:00:00-03:00", (2027, 4, 30), (2027, 5, 31)),
        ("2028-02-15T00:00:00-03:00", (2028, 1, 31), (2028, 2, 29)),
        ("2028-02-29T00:00:00-03:00", (2028, 2, 29), (2028, 3, 31)),
    ];
    for (i, (at, (y0, m0, d0), (y1, m1, d1))) in cases.into_iter().enumerate() {
        let start = start_of(Date::new(y0, m0, d0).expect("a date"), &tz);
        let reset = start_of(Date::new(y1, m1, d1).expect("a date"), &tz);
        let period_s = (reset.timestamp().as_second() - start.timestamp().as_second()) as u64;
        spend_then_denied(
            &app,
            "monthly",
            &format!("m{i}"),
            2,
            us(at),
            &reset,
            period_s,
        )
        .await;
    }
    let feb = start_of(Date::new(2027, 2, 28).expect("a date"), &tz);
    assert_eq!(shown(&feb), "2027-02-28T00:00:00-03:00");
}

async fn weeks_quarters_and_years_start_where_their_anchors_say(backend: Backend) {
    let app = spawn_app(backend).await;
    for policy in [
        json!({"name": "weekly-sunday", "algorithm": "fixed_window", "limit": 1,
               "calendar": {"unit": "week", "time_zone": "Asia/Kolkata", "week_start": "sunday"}}),
        json!({"name": "weekly", "algorithm": "fixed_window", "limit": 1,
               "calendar": {"unit": "week", "time_zone": "Australia/Sydney"}}),
        json!({"name": "quarterly", "algorithm": "fixed_window", "limit": 1,
               "calendar": {"unit": "quarter", "time_zone": "Asia/Kathmandu"}}),
        json!({"name": "yearly", "algorithm": "fixed_window", "limit": 1,
               "calendar": {"unit": "year", "time_zone": "Pacific/Chatham", "month_day": 15}}),
    ] {
        app.create_policy(policy).await;
    }
    let date = |y, m, d| Date::new(y, m, d).expect("a date");
    // (policy, zone, instant, the period's first day, the next period's first day)
    let cases = [
        // Friday 4 December 2026 in India (+05:30): weeks from Sunday.
        (
            "weekly-sunday",
            "Asia/Kolkata",
            "2026-12-04T10:00:00+05:30",
            date(2026, 11, 29),
            date(2026, 12, 6),
        ),
        (
            "weekly-sunday",
            "Asia/Kolkata",
            "2026-12-06T00:00:00+05:30",
            date(2026, 12, 6),
            date(2026, 12, 13),
        ),
        // ISO weeks in Sydney; daylight saving starts on Sunday 4 October 2026: a week of 167 h.
        (
            "weekly",
            "Australia/Sydney",
            "2026-10-01T09:00:00+10:00",
            date(2026, 9, 28),
            date(2026, 10, 5),
        ),
        (
            "weekly",
            "Australia/Sydney",
            "2026-10-05T00:00:00+11:00",
            date(2026, 10, 5),
            date(2026, 10, 12),
        ),
        // Quarters from January, April, July, October, in Nepal (+05:45).
        (
            "quarterly",
            "Asia/Kathmandu",
            "2026-12-04T10:00:00+05:45",
            date(2026, 10, 1),
            date(2027, 1, 1),
        ),
        (
            "quarterly",
            "Asia/Kathmandu",
            "2027-03-31T23:59:00+05:45",
            date(2027, 1, 1),
            date(2027, 4, 1),
        ),
        // Years from 15 January, on the Chatham Islands (+13:45 in summer).
        (
            "yearly",
            "Pacific/Chatham",
            "2027-01-14T23:59:00+13:45",
            date(2026, 1, 15),
            date(2027, 1, 15),
        ),
        (
            "yearly",
            "Pacific/Chatham",
            "2027-01-15T00:00:00+13:45",
            date(2027, 1, 15),
            date(2028, 1, 15),
        ),
    ];
    for (i, (policy, name, at, first, next)) in cases.into_iter().enumerate() {
        let tz = zone(name);
        let (start, reset) = (start_of(first, &tz), start_of(next, &tz));
        let period_s = (reset.timestamp().as_second() - start.timestamp().as_second()) as u64;
        spend_then_denied(&app, policy, &format!("w{i}"), 1, us(at), &reset, period_s).await;
    }
    let sydney = zone("Australia/Sydney");
    let week = start_of(date(2026, 10, 5), &sydney).timestamp().as_second()
        - start_of(date(2026, 9, 28), &sydney).timestamp().as_second();
    assert_eq!(week, 167 * 3_600, "the case covers a week of a DST change");
}

async fn a_calendar_limit_among_others_answers_its_own_reset(backend: Backend) {
    let app = spawn_app(backend).await;
    app.create_policy(json!({
        "name": "api-plan",
        "limits": [
            {"name": "burst", "algorithm": "token_bucket", "capacity": 10, "refill_tokens": 10, "refill_period_ms": 1000},
            {"name": "daily", "algorithm": "fixed_window", "limit": 3,
             "calendar": {"unit": "day", "time_zone": "America/New_York"}}
        ]
    }))
    .await;
    let at = us("2026-11-01T01:30:00-04:00");
    app.limiter.clock().set(at);
    for _ in 0..3 {
        let (v, _) = acquire(&app, "api-plan", "k").await;
        assert_eq!(v["allowed"], true, "{v}");
    }
    let (v, headers) = acquire(&app, "api-plan", "k").await;
    // 1 November 2026 in New York: 02:00 became 01:00, a day of 25 hours.
    assert_eq!(v["allowed"], false, "{v}");
    assert_eq!(v["violated"], json!(["daily"]), "{v}");
    assert_eq!(v["resets_at"], "2026-11-02T00:00:00-05:00", "{v}");
    let daily = &v["limits"][1];
    assert_eq!(daily["resets_at"], "2026-11-02T00:00:00-05:00", "{v}");
    let until_ms = (us("2026-11-02T00:00:00-05:00") - at) / 1_000;
    assert_eq!(daily["retry_after_ms"], until_ms, "{v}");
    // The bucket's reset is shown in UTC, at the decision's time plus its refill.
    let burst = &v["limits"][0];
    let burst_reset = burst["resets_at"].as_str().expect("a resets_at");
    assert!(burst_reset.ends_with('Z'), "{v}");
    assert_eq!(
        us(burst_reset),
        at + burst["reset_after_ms"].as_u64().expect("ms") * 1_000,
        "{v}"
    );
    assert_eq!(
        header(&headers, "ratelimit-policy"),
        "\"api-plan/burst\";q=10;w=1, \"api-plan/daily\";q=3;w=90000",
        "{v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calendar_policy_reads_back_as_written() {
    let app = spawn_app(Backend::Embedded).await;
    // `15.0` is a JSON Schema integer, so it is the 15th (Schemathesis sends such numbers).
    let policy = json!({
        "name": "q", "algorithm": "fixed_window", "limit": 100,
        "calendar": {"unit": "month", "time_zone": "europe/berlin", "month_day": 15.0}
    });
    app.create_policy(policy).await;
    let doc: Value = app
        .get("/v1/policies/q")
        .await
        .json()
        .await
        .expect("JSON policy");
    assert_eq!(
        doc["calendar"],
        json!({"unit": "month", "time_zone": "Europe/Berlin", "month_day": 15}),
        "the database's spelling, the anchor given: {doc}"
    );
    assert!(doc.get("window_ms").is_none(), "no window_ms: {doc}");
    assert_eq!(doc["limit"], 100);
}

/// Creates `policy`, expects a problem of `status` naming `field`, and checks nothing was stored.
async fn refused(app: &TestApp, policy: Value, status: u16, field: &str) {
    let r = app.post("/v1/policies", &policy).await;
    assert_eq!(r.status(), status, "{policy}");
    assert_eq!(
        r.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/problem+json"),
        "{policy}"
    );
    let problem: Value = r.json().await.expect("problem JSON");
    assert_eq!(problem["field"], field, "{policy}: {problem}");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains(field)),
        "the detail names `{field}`: {problem}"
    );
    let name = policy["name"].as_str().expect("a name");
    let r = app.get(&format!("/v1/policies/{name}")).await;
    assert_eq!(r.status(), 404, "{policy} was not stored");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_calendars_are_refused_naming_the_field() {
    let app = spawn_app(Backend::Embedded).await;
    let day = json!({"unit": "day", "time_zone": "Europe/Berlin"});
    let flat = |calendar: Value| json!({"name": "bad", "algorithm": "fixed_window", "limit": 5, "calendar": calendar});
    let cases = [
        (
            json!({"name": "bad", "algorithm": "fixed_window", "limit": 5, "window_ms": 1000, "calendar": day}),
            422,
            "window_ms",
        ),
        (
            json!({"name": "bad", "algorithm": "sliding_window_counter", "limit": 5, "calendar": day}),
            422,
            "calendar",
        ),
        (
            json!({"name": "bad", "algorithm": "token_bucket", "capacity": 5, "refill_tokens": 1, "refill_period_ms": 1000, "calendar": day}),
            422,
            "calendar",
        ),
        (
            flat(json!({"unit": "day", "time_zone": "Mars/Olympus_Mons"})),
            422,
            "calendar.time_zone",
        ),
        (
            flat(json!({"unit": "day", "time_zone": "Etc/Unknown"})),
            422,
            "calendar.time_zone",
        ),
        (
            flat(json!({"unit": "month", "time_zone": "UTC", "month_day": 32})),
            422,
            "calendar.month_day",
        ),
        (
            flat(json!({"unit": "month", "time_zone": "UTC", "month_day": 0})),
            422,
            "calendar.month_day",
        ),
        (
            flat(json!({"unit": "month", "time_zone": "UTC", "month_day": 2.5})),
            422,
            "calendar.month_day",
        ),
        (
            flat(json!({"unit": "day", "time_zone": "UTC", "month_day": 2})),
            422,
            "calendar.month_day",
        ),
        (
            flat(json!({"unit": "month", "time_zone": "UTC", "week_start": "sunday"})),
            422,
            "calendar.week_start",
        ),
        (
            flat(json!({"unit": "day", "time_zone": "UTC", "every": 2})),
            422,
            "calendar.every",
        ),
        (flat(json!({"time_zone": "UTC"})), 422, "calendar.unit"),
        (flat(json!({"unit": "day"})), 422, "calendar.time_zone"),
        (
            flat(json!({"unit": "fortnight", "time_zone": "UTC"})),
            400,
            "calendar.unit",
        ),
        (
            flat(json!({"unit": "week", "time_zone": "UTC", "week_start": "someday"})),
            400,
            "calendar.week_start",
        ),
        (
            flat(json!({"unit": "day", "time_zone": 7})),
            400,
            "calendar.time_zone",
        ),
        (
            flat(json!({"unit": "month", "time_zone": "UTC", "month_day": "31"})),
            400,
            "calendar.month_day",
        ),
        (flat(json!("day")), 400, "calendar"),
        (
            json!({"name": "bad", "limits": [
                {"name": "minute", "algorithm": "fixed_window", "limit": 5, "window_ms": 60000},
                {"name": "daily", "algorithm": "fixed_window", "limit": 50, "calendar": {"unit": "day", "time_zone": "Nowhere"}}
            ]}),
            422,
            "limits[1].calendar.time_zone",
        ),
        (
            json!({"name": "bad", "calendar": day, "limits": [
                {"name": "daily", "algorithm": "fixed_window", "limit": 50}
            ]}),
            422,
            "calendar",
        ),
        (
            json!({"name": "bad", "algorithm": "fixed_window", "limit": 5, "calendar": day,
                   "tiers": {"pro": {"bad": {"window_ms": 1000}}}}),
            422,
            "tiers.pro.bad.window_ms",
        ),
    ];
    for (policy, status, field) in cases {
        refused(&app, policy, status, field).await;
    }
    // A calendar without `window_ms` is not a fixed window missing one.
    let r = app
        .post(
            "/v1/policies",
            &json!({"name": "bad", "algorithm": "fixed_window", "limit": 5}),
        )
        .await;
    let problem: Value = r.json().await.expect("problem JSON");
    assert!(
        problem["detail"]
            .as_str()
            .is_some_and(|d| d.contains("calendar")),
        "a missing window_ms says a calendar may stand in: {problem}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fail_modes_answer_a_calendar_limit_with_its_own_periods() {
    // Redis hung: `local` decides on the instance's own store with the same boundaries, `open`
    // allows without counting, `closed` refuses.
    let redis = std::sync::Arc::new(crate::helpers::TestRedis::start());
    let app = crate::helpers::spawn_app_with(
        Some(redis.clone()),
        &[("RATELIMITER__REDIS__TIMEOUT_MS", "250")],
    )
    .await;
    for mode in ["local", "open", "closed"] {
        app.create_policy(json!({
            "name": format!("daily-{mode}"), "algorithm": "fixed_window", "limit": 2,
            "calendar": {"unit": "day", "time_zone": "Europe/Berlin"}, "fail_mode": mode
        }))
        .await;
    }
    // The day of 25 hours in Berlin.
    let at = us("2026-10-25T12:00:00+01:00");
    let midnight = next_midnight(at, &zone("Europe/Berlin"));
    app.limiter.clock().set(at);
    redis.signal("STOP");
    for _ in 0..2 {
        let (v, _) = acquire(&app, "daily-local", "k").await;
        assert_eq!(
            (&v["allowed"], &v["decided_by"]),
            (&json!(true), &json!("fail_local")),
            "{v}"
        );
    }
    let (v, headers) = acquire(&app, "daily-local", "k").await;
    let (open, _) = acquire(&app, "daily-open", "k").await;
    let closed = app
        .post(
            "/v1/acquire",
            &json!({"policy": "daily-closed", "key": "k"}),
        )
        .await
        .status();
    redis.signal("CONT");
    assert_eq!(
        (&v["allowed"], &v["decided_by"]),
        (&json!(false), &json!("fail_local")),
        "{v}"
    );
    assert_eq!(v["resets_at"], shown(&midnight), "{v}");
    assert_eq!(v["retry_after_ms"], (us_of(&midnight) - at) / 1_000, "{v}");
    assert_eq!(
        header(&headers, "ratelimit-policy"),
        "\"daily-local\";q=2;w=90000"
    );
    assert_eq!(
        (&open["allowed"], &open["decided_by"]),
        (&json!(true), &json!("fail_open")),
        "{open}"
    );
    assert_eq!(closed, 503);
}
