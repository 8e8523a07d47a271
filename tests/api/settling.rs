//! Settling usage over HTTP (issue 11): `POST /v1/peek`, `/v1/report`, `/v1/refund` and
//! `/v1/reset`, shadow mode and `decided_by`.
//!
//! On every store, for every algorithm alone and all of them in one policy: a peek writes
//! nothing (on Redis, each state key's value and absolute expiry stay byte for byte the same) and
//! answers as the acquire right after it; a report goes into debt, records at most twice the
//! quota, and is denied exactly until time has repaid it; a refund gives back at most what its
//! ticket took and only where it took it, never above the full quota, never to a subject without
//! state, never moving an expiry, and keeps the count exact among concurrent acquires; a ticket of
//! another subject, or a malformed one, is refused naming `ticket`; a reset gives one subject of
//! one policy its full quota and leaves every other as it was; a policy in shadow mode answers
//! allowed with enforcement's exact decision beside it, and counts its would-be denials. Every
//! answer says who decided, in `decided_by` and `Decided-By`. On the embedded store: who may
//! reset, and `limits.shadow`. With Redis stopped: each operation answered by its policy's fail
//! mode, and a reset refused.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use reqwest::header::HeaderMap;
use serde_json::{json, Value};

use crate::helpers::{
    clear_of_window_edges, masters, metric, policies_of_every_algorithm, spawn_app, spawn_app_on,
    spawn_app_with, Backend, TestApp, TestRedis,
};

crate::on_every_store!(
    a_peek_writes_nothing_and_answers_as_the_acquire_after_it,
    a_report_goes_into_debt_of_at_most_twice_the_quota_and_is_denied_until_time_repays_it,
    a_refund_gives_back_at_most_what_its_ticket_took_where_it_took_it,
    concurrent_acquires_and_refunds_keep_the_count_exact,
    a_reset_restores_one_subject_of_one_policy_and_nothing_else,
    shadow_mode_allows_with_enforcements_exact_decision_beside_it,
);

const HOUR_MS: u64 = 3_600_000;

/// Refunds without a ticket are refused unless this allows them (see tickets.rs for the
/// default): the tests of what such a refund does turn it on.
const TICKETLESS: (&str, &str) = ("RATELIMITER__LIMITS__TICKETLESS_REFUNDS", "true");
const DAY_MS: u64 = 86_400_000;

/// The limits of [`composite`], in policy order.
const COMPOSITE_LIMITS: [&str; 5] = ["window", "log", "counter", "bucket", "cell"];

// ---- Helpers ---------------------------------------------------------------------------------

/// A name for `backend` in policy names, so that the three runs of a test, which share the
/// process's metrics, count apart.
fn tag(backend: Backend) -> &'static str {
    match backend {
        Backend::Embedded => "embedded",
        Backend::Redis => "redis",
        Backend::Cluster => "cluster",
    }
}

/// One answered decision: its body and headers, and when it was asked and answered.
struct Answer {
    body: Value,
    headers: HeaderMap,
    sent: Instant,
    received: Instant,
}

impl Answer {
    fn n(&self, field: &str) -> u64 {
        self.body[field]
            .as_u64()
            .unwrap_or_else(|| panic!("a number `{field}` in {}", self.body))
    }

    fn allowed(&self) -> bool {
        self.body["allowed"]
            .as_bool()
            .unwrap_or_else(|| panic!("`allowed` in {}", self.body))
    }

    /// `field` of every limit in policy order: from `limits` for a policy of several, the
    /// top-level field for a policy of one.
    fn each(&self, field: &str) -> Vec<u64> {
        match self.body.get("limits") {
            Some(limits) => limits
                .as_array()
                .unwrap_or_else(|| panic!("`limits` in {}", self.body))
                .iter()
                .map(|l| {
                    l[field]
                        .as_u64()
                        .unwrap_or_else(|| panic!("`limits[].{field}` in {}", self.body))
                })
                .collect(),
            None => vec![self.n(field)],
        }
    }

    fn ticket(&self) -> Option<String> {
        self.body
            .get("ticket")
            .map(|t| t.as_str().expect("a string ticket").to_owned())
    }

    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ASCII header").to_owned())
    }

    /// The `r=` of every item of `RateLimit`, in order.
    fn ratelimit_remaining(&self) -> Vec<u64> {
        let value = self.header("ratelimit").expect("a RateLimit header");
        value
            .split(", ")
            .map(|item| {
                item.split(';')
                    .find_map(|p| p.strip_prefix("r="))
                    .and_then(|r| r.parse().ok())
                    .unwrap_or_else(|| panic!("`r=<n>` in {value:?}"))
            })
            .collect()
    }
}

/// The app under test, with the `decided_by` every answer of its store must carry.
struct Api<'a> {
    app: &'a TestApp,
    by: &'static str,
}

impl<'a> Api<'a> {
    /// Answers decided by `backend`'s store: `embedded`, or `redis` (one server or a cluster).
    fn new(app: &'a TestApp, backend: Backend) -> Self {
        let by = match backend {
            Backend::Embedded => "embedded",
            Backend::Redis | Backend::Cluster => "redis",
        };
        Self { app, by }
    }

    /// `POST /v1/<op>`: 200, decided by the store (body and `Decided-By`), not degraded.
    async fn call(&self, op: &str, request: Value) -> Answer {
        let sent = Instant::now();
        let r = self.app.post(&format!("/v1/{op}"), &request).await;
        let received = Instant::now();
        let status = r.status();
        let headers = r.headers().clone();
        let body: Value = r.json().await.expect("a JSON answer");
        assert_eq!(status, 200, "{op} {request}: {body}");
        assert_eq!(body["decided_by"], self.by, "{op} {request}: {body}");
        assert_eq!(body["degraded"], false, "{op} {request}: {body}");
        let answer = Answer {
            body,
            headers,
            sent,
            received,
        };
        assert_eq!(
            answer.header("decided-by").as_deref(),
            Some(self.by),
            "{op} {request}"
        );
        answer
    }

    async fn acquire(&self, policy: &str, key: &str, cost: u64) -> Answer {
        self.call(
            "acquire",
            json!({"policy": policy, "key": key, "cost": cost}),
        )
        .await
    }

    async fn peek(&self, policy: &str, key: &str, cost: u64) -> Answer {
        let a = self
            .call("peek", json!({"policy": policy, "key": key, "cost": cost}))
            .await;
        assert_eq!(a.ticket(), None, "a peek takes nothing: {}", a.body);
        a
    }

    /// A report: always allowed, with a ticket when it recorded anything.
    async fn report(&self, policy: &str, key: &str, cost: u64) -> Answer {
        let a = self
            .call(
                "report",
                json!({"policy": policy, "key": key, "cost": cost}),
            )
            .await;
        assert_eq!(a.body["allowed"], true, "a report is allowed: {}", a.body);
        a
    }

    /// A refund: always allowed, never with a ticket; `refunded` is checked by the caller.
    async fn refund(&self, policy: &str, key: &str, cost: u64, ticket: Option<&str>) -> Answer {
        let mut request = json!({"policy": policy, "key": key, "cost": cost});
        if let Some(t) = ticket {
            request["ticket"] = json!(t);
        }
        let a = self.call("refund", request).await;
        assert_eq!(a.body["allowed"], true, "a refund is allowed: {}", a.body);
        assert_eq!(a.ticket(), None, "a refund takes nothing: {}", a.body);
        a
    }

    /// A refund's `refunded`.
    async fn refunded(&self, policy: &str, key: &str, cost: u64, ticket: Option<&str>) -> u64 {
        self.refund(policy, key, cost, ticket).await.n("refunded")
    }
}

/// `POST /v1/reset`'s status.
async fn reset(app: &TestApp, policy: &str, key: &str) -> u16 {
    app.post("/v1/reset", &json!({"policy": policy, "key": key}))
        .await
        .status()
        .as_u16()
}

/// Whether `later`, a wait decided no more than `elapsed` after `earlier` was, ends when
/// `earlier` does: a wait only shrinks as time passes, and by no more than the time between the
/// two decisions (plus 1 ms of rounding each way). Both 0 when both were allowed.
fn same_deadline(earlier: u64, later: u64, elapsed: Duration) -> bool {
    let elapsed = elapsed.as_millis() as u64 + 1;
    later <= earlier + 1 && later + elapsed >= earlier
}

/// A policy of one limit of every algorithm, the `n`-th (see [`COMPOSITE_LIMITS`]) with quota
/// `quota + n`: the fixed window is the tightest. Every limit refills too slowly to give
/// anything back during a test.
fn composite(name: &str, quota: u64) -> Value {
    json!({"name": name, "limits": [
        {"name": "window", "algorithm": "fixed_window", "limit": quota, "window_ms": HOUR_MS},
        {"name": "log", "algorithm": "sliding_window_log", "limit": quota + 1, "window_ms": HOUR_MS},
        {"name": "counter", "algorithm": "sliding_window_counter", "limit": quota + 2, "window_ms": HOUR_MS},
        {"name": "bucket", "algorithm": "token_bucket", "capacity": quota + 3, "refill_tokens": 1, "refill_period_ms": DAY_MS},
        {"name": "cell", "algorithm": "gcra", "rate": 1, "period_ms": DAY_MS, "burst": quota + 4},
    ]})
}

/// Creates a policy of every algorithm alone with quota `quota` and one of all of them
/// ([`composite`]), named `<prefix>-…`; returns each name with its limits' quotas.
async fn create_every_shape(app: &TestApp, prefix: &str, quota: u64) -> Vec<(String, Vec<u64>)> {
    let mut shapes = Vec::new();
    for policy in policies_of_every_algorithm(prefix, quota) {
        let name = policy["name"].as_str().expect("name").to_owned();
        app.create_policy(policy).await;
        shapes.push((name, vec![quota]));
    }
    let name = format!("{prefix}-composite");
    app.create_policy(composite(&name, quota)).await;
    shapes.push((name, (quota..quota + 5).collect()));
    shapes
}

/// What one subject has in Redis: each state key with its value as `DUMP` serializes it and
/// its absolute expiry (`PEXPIRETIME`, ms).
type Snapshot = BTreeMap<String, (Vec<u8>, i64)>;

/// Every state key of `policy`'s subject `key` on the masters (see [`Snapshot`]); None on the
/// embedded store, whose state only answers can show.
fn snapshot(app: &TestApp, policy: &str, key: &str) -> Option<Snapshot> {
    let mut found = Snapshot::new();
    for mut conn in masters(app)? {
        let keys: Vec<String> = ::redis::cmd("KEYS")
            .arg(format!("rl:{{{policy}:{key}}}:*"))
            .query(&mut conn)
            .expect("KEYS");
        for k in keys {
            let value: Vec<u8> = ::redis::cmd("DUMP").arg(&k).query(&mut conn).expect("DUMP");
            let expiry: i64 = ::redis::cmd("PEXPIRETIME")
                .arg(&k)
                .query(&mut conn)
                .expect("PEXPIRETIME");
            found.insert(k, (value, expiry));
        }
    }
    Some(found)
}

/// `ratelimiter_operations_total` and `ratelimiter_operation_units_total` of `policy`'s
/// `operation`.
async fn operations(app: &TestApp, policy: &str, operation: &str) -> (f64, f64) {
    let labels = [("policy", policy), ("operation", operation)];
    (
        metric(app, "ratelimiter_operations_total", &labels).await,
        metric(app, "ratelimiter_operation_units_total", &labels).await,
    )
}

// ---- 1. Peek ---------------------------------------------------------------------------------

async fn a_peek_writes_nothing_and_answers_as_the_acquire_after_it(backend: Backend) {
    let app = spawn_app(backend).await;
    let api = Api::new(&app, backend);
    clear_of_window_edges(&[HOUR_MS]).await;
    for (p, quotas) in create_every_shape(&app, &format!("{}-peek", tag(backend)), 5).await {
        let p = p.as_str();
        let after = |taken: u64| -> Vec<u64> { quotas.iter().map(|q| q - taken).collect() };

        // A subject without state: its full quota, and a peek leaves it without state.
        let d = api.peek(p, "fresh", 5).await;
        assert!(d.allowed(), "{p}: {}", d.body);
        assert_eq!(d.each("remaining"), quotas, "{p}: {}", d.body);
        if let Some(keys) = snapshot(&app, p, "fresh") {
            assert_eq!(keys, Snapshot::new(), "{p}: a peek created state");
        }

        let d = api.acquire(p, "k", 2).await;
        assert!(d.allowed(), "{p}: {}", d.body);
        let before = snapshot(&app, p, "k");
        if let Some(keys) = &before {
            assert_eq!(keys.len(), quotas.len(), "{p}: one key per limit: {keys:?}");
            assert!(
                keys.values().all(|(_, expiry)| *expiry > 0),
                "{p}: each key expires: {keys:?}"
            );
        }
        // Peeks that fit and peeks that do not: each sees the 3 units left, none takes any.
        for cost in [1, 3, 4, 5, 4, 1] {
            let d = api.peek(p, "k", cost).await;
            assert_eq!(d.allowed(), cost <= 3, "{p} cost {cost}: {}", d.body);
            assert_eq!(d.each("remaining"), after(2), "{p} cost {cost}: {}", d.body);
            assert_eq!(d.n("retry_after_ms") > 0, cost > 3, "{p}: {}", d.body);
            assert_eq!(d.header("retry-after").is_some(), cost > 3, "{p}");
        }
        assert_eq!(
            snapshot(&app, p, "k"),
            before,
            "{p}: the peeks changed a value or an expiry"
        );

        // Each peek answers as the acquire right after it; an allowed one shows the units the
        // acquire then takes still there.
        let mut left = 3;
        for cost in [4, 1, 3, 1, 1, 1] {
            let peeked = api.peek(p, "k", cost).await;
            let acquired = api.acquire(p, "k", cost).await;
            let allowed = cost <= left;
            let what = format!(
                "{p} cost {cost}: peek {} acquire {}",
                peeked.body, acquired.body
            );
            assert_eq!(peeked.allowed(), allowed, "{what}");
            assert_eq!(acquired.allowed(), allowed, "{what}");
            let elapsed = acquired.received - peeked.sent;
            assert!(
                same_deadline(
                    peeked.n("retry_after_ms"),
                    acquired.n("retry_after_ms"),
                    elapsed
                ),
                "{what}"
            );
            for (pr, ar) in peeked
                .each("retry_after_ms")
                .into_iter()
                .zip(acquired.each("retry_after_ms"))
            {
                assert!(same_deadline(pr, ar, elapsed), "{what}");
            }
            assert_eq!(peeked.body["violated"], acquired.body["violated"], "{what}");
            assert_eq!(
                peeked.header("retry-after").is_some(),
                !allowed,
                "{what}: Retry-After as the acquire"
            );
            assert_eq!(acquired.header("retry-after").is_some(), !allowed, "{what}");
            let taken = if allowed { cost } else { 0 };
            assert_eq!(
                peeked.n("remaining"),
                acquired.n("remaining") + taken,
                "{what}"
            );
            let expected: Vec<u64> = acquired
                .each("remaining")
                .iter()
                .map(|r| r + taken)
                .collect();
            assert_eq!(peeked.each("remaining"), expected, "{what}");
            left -= taken;
        }
        assert_eq!(left, 0, "{p}");
    }
}

// ---- 2. Report -------------------------------------------------------------------------------

async fn a_report_goes_into_debt_of_at_most_twice_the_quota_and_is_denied_until_time_repays_it(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    let api = Api::new(&app, backend);
    clear_of_window_edges(&[HOUR_MS]).await;
    let prefix = format!("{}-report", tag(backend));

    // Every algorithm: three times the (tightest) quota reported at once records at most twice
    // each limit's quota; the subject is then in debt on every limit and denied.
    for (p, quotas) in create_every_shape(&app, &prefix, 5).await {
        let p = p.as_str();
        let composite = quotas.len() > 1;
        let (reports, units) = operations(&app, p, "report").await;
        let cost = 3 * quotas[0];
        let recorded: Vec<u64> = quotas.iter().map(|q| cost.min(2 * q)).collect();

        let d = api.report(p, "k", cost).await;
        assert!(
            d.ticket().is_some(),
            "{p}: a report that took units: {}",
            d.body
        );
        assert_eq!(
            d.each("remaining"),
            vec![0; quotas.len()],
            "{p}: {}",
            d.body
        );
        assert_eq!(d.n("remaining"), 0, "{p}: {}", d.body);
        assert!(
            d.each("retry_after_ms").iter().all(|r| *r > 0),
            "{p}: every limit waits for a unit: {}",
            d.body
        );
        assert!(d.n("retry_after_ms") > 0, "{p}: {}", d.body);
        if composite {
            assert_eq!(d.each("units"), recorded, "{p}: {}", d.body);
        } else {
            assert_eq!(d.body.get("units"), None, "{p}: {}", d.body);
        }
        let (reports_now, units_now) = operations(&app, p, "report").await;
        assert_eq!(reports_now - reports, 1.0, "{p}: one report counted");
        if !composite {
            assert_eq!(
                units_now - units,
                (2 * quotas[0]) as f64,
                "{p}: units recorded"
            );
        }

        // At its bound a limit records nothing more; one still below it records the unit.
        let d = api.report(p, "k", 1).await;
        let more: Vec<u64> = quotas
            .iter()
            .zip(&recorded)
            .map(|(q, r)| (2 * q - r).min(1))
            .collect();
        if composite {
            assert_eq!(d.each("units"), more, "{p}: {}", d.body);
        } else {
            let (_, units_after) = operations(&app, p, "report").await;
            assert_eq!(
                units_after, units_now,
                "{p}: nothing recorded past the bound"
            );
        }
        assert_eq!(
            d.ticket().is_some(),
            more.iter().any(|m| *m > 0),
            "{p}: a ticket only for units taken: {}",
            d.body
        );

        let d = api.acquire(p, "k", 1).await;
        assert!(!d.allowed(), "{p}: in debt: {}", d.body);
        assert!(d.n("retry_after_ms") > 0, "{p}: {}", d.body);
        if composite {
            assert_eq!(
                d.body["violated"],
                json!(COMPOSITE_LIMITS),
                "{p}: {}",
                d.body
            );
        }
    }

    // A bucket of 4 refilled at one token every 500 ms: a report of 7 leaves a debt of 3, so one
    // unit is back 2 s after the report, and every acquire before then is denied with a wait
    // that ends at that same moment.
    let debt = format!("{prefix}-debt");
    app.create_policy(json!({"name": debt, "algorithm": "token_bucket", "capacity": 4, "refill_tokens": 4, "refill_period_ms": 2_000}))
        .await;
    let reported = api.report(&debt, "k", 7).await;
    assert_eq!(reported.n("remaining"), 0, "{}", reported.body);
    let retry = reported.n("retry_after_ms");
    assert!((1_501..=2_000).contains(&retry), "{}", reported.body);
    // The moment one unit is back lies in [earliest, latest] (1 ms of rounding).
    let ms = Duration::from_millis;
    let earliest = reported.sent + ms(retry) - ms(1);
    let latest = reported.received + ms(retry);
    // A denial's wait points at a moment in its own such span, which must meet the report's.
    let consistent = |d: &Answer, units_after: u64| {
        let wait = ms(d.n("retry_after_ms"));
        let extra = ms(500 * units_after);
        d.sent + wait - ms(1) <= latest + extra && d.received + wait + ms(1) >= earliest + extra
    };
    let d = api.acquire(&debt, "k", 1).await;
    assert!(!d.allowed(), "{}", d.body);
    assert!(
        consistent(&d, 0),
        "retry {} vs {retry}: {}",
        d.n("retry_after_ms"),
        d.body
    );
    // Four units take three more refills after the first.
    let d = api.peek(&debt, "k", 4).await;
    assert!(!d.allowed(), "{}", d.body);
    assert!(consistent(&d, 3), "{}", d.body);

    tokio::time::sleep_until((earliest - ms(400)).into()).await;
    let d = api.acquire(&debt, "k", 1).await;
    if d.allowed() {
        assert!(
            d.received >= earliest,
            "allowed before the debt was repaid: {}",
            d.body
        );
    } else {
        assert!(consistent(&d, 0), "{}", d.body);
    }

    tokio::time::sleep_until((latest + ms(150)).into()).await;
    let d = api.acquire(&debt, "k", 1).await;
    assert!(d.allowed(), "the debt is repaid: {}", d.body);
    // Whole units refilled since the first one came back, if the request was late.
    let most = (d.received - earliest).as_millis() as u64 / 500;
    assert!(d.n("remaining") <= most, "{}", d.body);
}

// ---- 3. Refund -------------------------------------------------------------------------------

/// A refund of `policy`'s subject `key` with `ticket`, refused with 422 naming `ticket`.
async fn refused_refund(app: &TestApp, policy: &str, key: &str, ticket: &str) {
    let r = app
        .post(
            "/v1/refund",
            &json!({"policy": policy, "key": key, "cost": 1, "ticket": ticket}),
        )
        .await;
    let status = r.status();
    let content_type = r
        .headers()
        .get("content-type")
        .map(|v| v.to_str().expect("ASCII").to_owned());
    let problem: Value = r.json().await.expect("problem JSON");
    assert_eq!(status, 422, "{policy}/{key} ticket {ticket:?}: {problem}");
    assert_eq!(content_type.as_deref(), Some("application/problem+json"));
    assert_eq!(problem["field"], "ticket", "{ticket:?}: {problem}");
}

async fn a_refund_gives_back_at_most_what_its_ticket_took_where_it_took_it(backend: Backend) {
    let app = spawn_app_on(backend, &[TICKETLESS]).await;
    let api = Api::new(&app, backend);
    clear_of_window_edges(&[HOUR_MS]).await;
    let prefix = format!("{}-refund", tag(backend));
    let mut ticket_of_another_policy: Option<String> = None;
    for (p, quotas) in create_every_shape(&app, &prefix, 5).await {
        let p = p.as_str();
        let composite = quotas.len() > 1;
        let (refunds, units) = operations(&app, p, "refund").await;

        // Nothing to give back to a subject without state, and no state made for it.
        let d = api.refund(p, "fresh", 4, None).await;
        assert_eq!(d.n("refunded"), 0, "{p}: {}", d.body);
        assert_eq!(d.each("remaining"), quotas, "{p}: {}", d.body);
        if composite {
            assert_eq!(d.each("units"), vec![0; 5], "{p}: {}", d.body);
        }
        if let Some(keys) = snapshot(&app, p, "fresh") {
            assert_eq!(keys, Snapshot::new(), "{p}: a refund created state");
        }

        // Up to what the ticket took, back to the full quota, without moving an expiry.
        let taken = api.acquire(p, "k", 3).await;
        let ticket = taken.ticket().expect("an allowed acquire's ticket");
        let before = snapshot(&app, p, "k");
        let d = api.refund(p, "k", 10, Some(&ticket)).await;
        assert_eq!(d.n("refunded"), 3, "{p}: {}", d.body);
        assert_eq!(d.each("remaining"), quotas, "{p}: {}", d.body);
        if composite {
            assert_eq!(d.each("units"), vec![3; 5], "{p}: {}", d.body);
        }
        if let (Some(before), Some(now)) = (&before, snapshot(&app, p, "k")) {
            for (k, (_, expiry)) in &now {
                // The ticket's record of what it gave back is new (see tickets.rs).
                if k.contains("}:ticket:") {
                    continue;
                }
                let was = before.get(k).map(|(_, e)| *e);
                assert_eq!(Some(*expiry), was, "{p}: {k}'s expiry moved, or it is new");
            }
        }
        // The same ticket again: nothing is in use any more.
        assert_eq!(api.refunded(p, "k", 10, Some(&ticket)).await, 0, "{p}");

        // Tickets of another key or policy, and malformed ones, are refused and give nothing.
        let d = api.acquire(p, "k", 1).await;
        assert_eq!(
            d.each("remaining"),
            quotas.iter().map(|q| q - 1).collect::<Vec<_>>()
        );
        let other_key = api.acquire(p, "other", 1).await.ticket().expect("ticket");
        refused_refund(&app, p, "k", &other_key).await;
        if let Some(t) = &ticket_of_another_policy {
            refused_refund(&app, p, "k", t).await;
        }
        let long = "1".repeat(300);
        for malformed in [
            "",
            "garbage",
            "1.3.zzzzzzzz.1",
            "9.3.00000000.1",
            "1.3.00000000",
            &long,
        ] {
            refused_refund(&app, p, "k", malformed).await;
        }
        // Never above the full quota: 1 in use, 3 asked, 1 given.
        let d = api.refund(p, "k", 3, None).await;
        assert_eq!(d.n("refunded"), 1, "{p}: {}", d.body);
        assert_eq!(d.each("remaining"), quotas, "{p}: {}", d.body);

        let (refunds_now, units_now) = operations(&app, p, "refund").await;
        assert_eq!(
            refunds_now - refunds,
            4.0,
            "{p}: every accepted refund counted"
        );
        assert_eq!(units_now - units, 4.0, "{p}: the units given back");
        ticket_of_another_policy = Some(ticket);
    }

    let ended = ticket_of_an_ended_window_gives_nothing_back(&api, &prefix);
    let bucket = a_ticket_gives_back_only_what_time_has_not_refilled(&api, &prefix, "token_bucket");
    let cell = a_ticket_gives_back_only_what_time_has_not_refilled(&api, &prefix, "gcra");
    tokio::join!(ended, bucket, cell);
}

/// A fixed window of 2 s: a ticket whose window has ended gives nothing back, and the next
/// window's count is left as it is; that window's own ticket gives back its units.
async fn ticket_of_an_ended_window_gives_nothing_back(api: &Api<'_>, prefix: &str) {
    let p = format!("{prefix}-seconds");
    api.app
        .create_policy(
            json!({"name": p, "algorithm": "fixed_window", "limit": 5, "window_ms": 2_000}),
        )
        .await;
    let first = api.acquire(&p, "k", 3).await;
    let old = first.ticket().expect("ticket");
    let next_window = first.received + Duration::from_millis(first.n("reset_after_ms") + 30);
    tokio::time::sleep_until(next_window.into()).await;
    let second = api.acquire(&p, "k", 2).await;
    assert_eq!(second.n("remaining"), 3, "a new window: {}", second.body);
    let d = api.refund(&p, "k", 5, Some(&old)).await;
    assert_eq!(d.n("refunded"), 0, "the old window is gone: {}", d.body);
    assert_eq!(
        d.n("remaining"),
        3,
        "the new window's count is untouched: {}",
        d.body
    );
    let new = second.ticket().expect("ticket");
    let d = api.refund(&p, "k", 5, Some(&new)).await;
    assert_eq!(d.n("refunded"), 2, "{}", d.body);
    assert_eq!(d.n("remaining"), 5, "{}", d.body);
}

/// A `token_bucket` or `gcra` of 4 units refilled one every 500 ms: 4 taken, then 2 more 1.25 s
/// later. A refund with the first ticket gives back only the part of its 4 that time has not
/// refilled, about 1.5 units (so 1 or 2), where one without a ticket could give all 4.
async fn a_ticket_gives_back_only_what_time_has_not_refilled(
    api: &Api<'_>,
    prefix: &str,
    algorithm: &str,
) {
    let p = format!("{prefix}-refilled-{algorithm}");
    let policy = match algorithm {
        "token_bucket" => {
            json!({"name": p, "algorithm": algorithm, "capacity": 4, "refill_tokens": 4, "refill_period_ms": 2_000})
        }
        _ => json!({"name": p, "algorithm": algorithm, "rate": 4, "period_ms": 2_000, "burst": 4}),
    };
    api.app.create_policy(policy).await;
    let first = api.acquire(&p, "k", 4).await;
    assert!(first.allowed(), "{p}: {}", first.body);
    let ticket = first.ticket().expect("ticket");
    tokio::time::sleep_until((first.received + Duration::from_millis(1_250)).into()).await;
    let second = api.acquire(&p, "k", 2).await;
    assert!(second.allowed(), "{p}: 2.5 units refilled: {}", second.body);
    let d = api.refund(&p, "k", 4, Some(&ticket)).await;
    // The first take's units still out at the refund: (its mark - now) / 500 ms, the mark being
    // 2 s after it was taken.
    let out = |taken: Instant, refund: Instant| {
        (taken + Duration::from_millis(2_000))
            .saturating_duration_since(refund)
            .as_secs_f64()
            / 0.5
    };
    let fewest = out(first.sent, d.received).floor() as u64;
    let most = out(first.received, d.sent).ceil() as u64;
    let refunded = d.n("refunded");
    assert!(
        (fewest..=most).contains(&refunded) && refunded < 4,
        "{p}: refunded {refunded}, expected {fewest}..={most}: {}",
        d.body
    );
}

// ---- 4. Concurrency --------------------------------------------------------------------------

async fn concurrent_acquires_and_refunds_keep_the_count_exact(backend: Backend) {
    let app = spawn_app_on(backend, &[TICKETLESS]).await;
    let api = Api::new(&app, backend);
    let p = format!("{}-crowd", tag(backend));
    app.create_policy(
        json!({"name": p, "algorithm": "fixed_window", "limit": 50, "window_ms": HOUR_MS}),
    )
    .await;
    clear_of_window_edges(&[HOUR_MS]).await;
    // 200 acquires and 50 refunds of one unit each, without tickets, interleaved.
    let calls = (0..250).map(|i| {
        let (client, address, p) = (app.client.clone(), app.address.clone(), p.clone());
        let op = if i % 5 == 2 { "refund" } else { "acquire" };
        tokio::spawn(async move {
            let r = client
                .post(format!("{address}/v1/{op}"))
                .json(&json!({"policy": p, "key": "hot", "cost": 1}))
                .send()
                .await
                .expect("sent");
            assert_eq!(r.status(), 200, "{op}");
            (op, r.json::<Value>().await.expect("JSON"))
        })
    });
    let answers: Vec<(&str, Value)> = join_all(calls)
        .await
        .into_iter()
        .map(|r| r.expect("task"))
        .collect();
    let mut admitted = 0;
    let mut refunded = 0;
    for (op, d) in &answers {
        // A denial may be repeated by the instance's denial cache (exact, see denial_cache.rs).
        let cached = api.by == "redis" && d["allowed"] == false && d["decided_by"] == "local_cache";
        if !cached {
            assert_eq!(d["decided_by"], api.by, "{op}: {d}");
        }
        match *op {
            "acquire" => admitted += u64::from(d["allowed"] == true),
            _ => refunded += d["refunded"].as_u64().expect("refunded"),
        }
    }
    assert_eq!(answers.iter().filter(|(op, _)| *op == "refund").count(), 50);
    assert!(refunded <= 50, "{refunded}");
    assert!(admitted >= 50, "at least the limit: {admitted}");
    assert!(
        admitted <= 50 + refunded,
        "admitted {admitted} with {refunded} refunded"
    );
    let d = api.peek(&p, "hot", 1).await;
    assert_eq!(
        d.n("remaining"),
        50 + refunded - admitted,
        "admitted {admitted}, refunded {refunded}: {}",
        d.body
    );
}

// ---- 5. Reset --------------------------------------------------------------------------------

/// Peeks each `(policy, key)` and checks each limit's remaining units.
async fn check(api: &Api<'_>, expect: Vec<(&str, &str, Vec<u64>)>) {
    for (p, k, remaining) in expect {
        let d = api.peek(p, k, 1).await;
        assert_eq!(d.each("remaining"), remaining, "{p}/{k}: {}", d.body);
        assert_eq!(d.allowed(), remaining[0] > 0, "{p}/{k}: {}", d.body);
    }
}

async fn a_reset_restores_one_subject_of_one_policy_and_nothing_else(backend: Backend) {
    let app = spawn_app(backend).await;
    let api = Api::new(&app, backend);
    clear_of_window_edges(&[HOUR_MS]).await;
    let prefix = format!("{}-reset", tag(backend));
    let (a, b, c) = (
        format!("{prefix}-bucket"),
        format!("{prefix}-log"),
        format!("{prefix}-composite"),
    );
    app.create_policy(json!({"name": a, "algorithm": "token_bucket", "capacity": 3, "refill_tokens": 1, "refill_period_ms": DAY_MS}))
        .await;
    app.create_policy(
        json!({"name": b, "algorithm": "sliding_window_log", "limit": 3, "window_ms": HOUR_MS}),
    )
    .await;
    app.create_policy(composite(&c, 3)).await;
    let keys = ["k1", "k2", "k3"];
    // Every subject exhausted; in the composite policy only the window, the others part-used.
    for p in [&a, &b, &c] {
        for k in keys {
            assert!(api.acquire(p, k, 3).await.allowed(), "{p}/{k}");
        }
    }
    let exhausted = |p: &str| -> Vec<u64> {
        if p == c {
            vec![0, 1, 2, 3, 4]
        } else {
            vec![0]
        }
    };
    let (resets_a, _) = operations(&app, &a, "reset").await;

    assert_eq!(reset(&app, &a, "k2").await, 204);
    let mut expect = Vec::new();
    for p in [a.as_str(), &b, &c] {
        for k in keys {
            let restored = p == a && k == "k2";
            expect.push((p, k, if restored { vec![3] } else { exhausted(p) }));
        }
    }
    check(&api, expect).await;
    if let Some(gone) = snapshot(&app, &a, "k2") {
        assert_eq!(gone, Snapshot::new(), "its state is deleted");
        for k in ["k1", "k3"] {
            assert_eq!(snapshot(&app, &a, k).map(|s| s.len()), Some(1), "{k}");
        }
        assert_eq!(snapshot(&app, &b, "k2").map(|s| s.len()), Some(1));
    }

    // Every limit of a composite policy is reset, not only the exhausted one.
    assert_eq!(reset(&app, &c, "k1").await, 204);
    check(
        &api,
        vec![
            (c.as_str(), "k1", vec![3, 4, 5, 6, 7]),
            (&c, "k2", exhausted(&c)),
            (&c, "k3", exhausted(&c)),
            (&a, "k1", exhausted(&a)),
        ],
    )
    .await;
    if let Some(gone) = snapshot(&app, &c, "k1") {
        assert_eq!(gone, Snapshot::new(), "every limit's state is deleted");
    }

    // A subject without state is reset all the same; an unknown policy is not found.
    assert_eq!(reset(&app, &a, "never").await, 204);
    assert_eq!(reset(&app, &format!("{prefix}-missing"), "k1").await, 404);
    let (resets_a_now, _) = operations(&app, &a, "reset").await;
    assert_eq!(resets_a_now - resets_a, 2.0, "resets counted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_needs_an_admin_token_when_there_are_any_and_a_client_token_otherwise() {
    let policy = json!({"name": "guarded-reset", "algorithm": "fixed_window", "limit": 2, "window_ms": HOUR_MS});
    let request = json!({"policy": "guarded-reset", "key": "k"});
    let send = |app: &TestApp, path: &str, token: Option<&str>, body: &Value| {
        let mut req = app.client.post(app.url(path)).json(body);
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        req.send()
    };
    clear_of_window_edges(&[HOUR_MS]).await;

    let app = spawn_app_with(
        None,
        &[
            ("RATELIMITER__AUTH__ADMIN_TOKENS", "admin-one"),
            ("RATELIMITER__AUTH__CLIENT_TOKENS", "client-one"),
        ],
    )
    .await;
    let r = send(&app, "/v1/policies", Some("admin-one"), &policy)
        .await
        .expect("sent");
    assert_eq!(r.status(), 201);
    let acquire = json!({"policy": "guarded-reset", "key": "k", "cost": 2});
    let r = send(&app, "/v1/acquire", Some("client-one"), &acquire)
        .await
        .expect("sent");
    assert_eq!(r.status(), 200);
    for token in [None, Some("client-one"), Some("wrong")] {
        let r = send(&app, "/v1/reset", token, &request)
            .await
            .expect("sent");
        assert_eq!(r.status(), 401, "{token:?}");
    }
    let peek = json!({"policy": "guarded-reset", "key": "k"});
    let remaining = |app: &TestApp| {
        let peek = peek.clone();
        let app_url = app.url("/v1/peek");
        let client = app.client.clone();
        async move {
            let r = client
                .post(app_url)
                .bearer_auth("client-one")
                .json(&peek)
                .send()
                .await
                .expect("sent");
            assert_eq!(r.status(), 200);
            r.json::<Value>().await.expect("JSON")["remaining"].clone()
        }
    };
    assert_eq!(remaining(&app).await, 0, "a refused reset deleted nothing");
    let r = send(&app, "/v1/reset", Some("admin-one"), &request)
        .await
        .expect("sent");
    assert_eq!(r.status(), 204);
    assert_eq!(remaining(&app).await, 2);

    // Without admin tokens, a client token resets (it is never open while acquires are guarded).
    let app = spawn_app_with(None, &[("RATELIMITER__AUTH__CLIENT_TOKENS", "client-one")]).await;
    let r = send(&app, "/v1/policies", None, &policy)
        .await
        .expect("sent");
    assert_eq!(r.status(), 201);
    let r = send(&app, "/v1/acquire", Some("client-one"), &acquire)
        .await
        .expect("sent");
    assert_eq!(r.status(), 200);
    let r = send(&app, "/v1/reset", None, &request).await.expect("sent");
    assert_eq!(r.status(), 401);
    assert_eq!(remaining(&app).await, 0);
    let r = send(&app, "/v1/reset", Some("client-one"), &request)
        .await
        .expect("sent");
    assert_eq!(r.status(), 204);
    assert_eq!(remaining(&app).await, 2);
}

// ---- 6. Shadow mode --------------------------------------------------------------------------

/// `ratelimiter_shadow_denied_total` and `ratelimiter_shadow_denied_units_total` of `policy`.
async fn shadow_denied(app: &TestApp, policy: &str) -> (f64, f64) {
    let labels = [("policy", policy)];
    (
        metric(app, "ratelimiter_shadow_denied_total", &labels).await,
        metric(app, "ratelimiter_shadow_denied_units_total", &labels).await,
    )
}

async fn shadow_mode_allows_with_enforcements_exact_decision_beside_it(backend: Backend) {
    let app = spawn_app(backend).await;
    let api = Api::new(&app, backend);
    clear_of_window_edges(&[HOUR_MS]).await;
    let t = tag(backend);
    let shapes = [
        (
            "several",
            json!([
                {"name": "window", "algorithm": "fixed_window", "limit": 10, "window_ms": HOUR_MS},
                {"name": "bucket", "algorithm": "token_bucket", "capacity": 6, "refill_tokens": 1, "refill_period_ms": DAY_MS},
            ]),
            vec![3, 2, 4, 1, 6, 2, 1, 1],
        ),
        (
            "one",
            json!([{"algorithm": "sliding_window_log", "limit": 4, "window_ms": HOUR_MS}]),
            vec![3, 2, 1, 4, 1],
        ),
    ];
    for (shape, limits, costs) in shapes {
        let enforced = format!("{t}-enforced-{shape}");
        let shadowed = format!("{t}-shadowed-{shape}");
        app.create_policy(json!({"name": enforced, "limits": limits, "mode": "enforce"}))
            .await;
        app.create_policy(json!({"name": shadowed, "limits": limits, "mode": "shadow"}))
            .await;

        // The same acquires to both, in lockstep.
        let (mut would_deny, mut would_deny_units, mut admitted) = (0, 0, 0);
        let mut skew = Duration::ZERO;
        for cost in &costs {
            let e = api.acquire(&enforced, "k", *cost).await;
            let s = api.acquire(&shadowed, "k", *cost).await;
            let what = format!(
                "{shape} cost {cost}: enforced {} shadowed {}",
                e.body, s.body
            );
            assert!(s.allowed(), "{what}");
            assert_eq!(s.body["shadow"], true, "{what}");
            assert_eq!(s.body["would_allow"], e.body["allowed"], "{what}");
            assert_eq!(e.body.get("shadow"), None, "{what}");
            assert_eq!(e.body.get("would_allow"), None, "{what}");
            assert_eq!(s.n("limit"), e.n("limit"), "{what}");
            assert_eq!(s.n("remaining"), e.n("remaining"), "{what}");
            assert_eq!(s.each("remaining"), e.each("remaining"), "{what}");
            // The two subjects took their units up to `skew` apart, so their waits end up to
            // that apart too, and each is measured from its own decision.
            skew = skew.max(s.received - e.sent);
            let close = |a: u64, b: u64| a.abs_diff(b) <= 2 * skew.as_millis() as u64 + 2;
            assert!(
                close(e.n("retry_after_ms"), s.n("retry_after_ms")),
                "{what}"
            );
            for (er, sr) in e
                .each("retry_after_ms")
                .into_iter()
                .zip(s.each("retry_after_ms"))
            {
                assert!(close(er, sr), "{what}");
            }
            assert_eq!(s.body.get("violated"), e.body.get("violated"), "{what}");
            // A would-be denial took nothing, so there is nothing to refund.
            assert_eq!(s.ticket().is_some(), e.allowed(), "{what}");
            assert_eq!(s.header("retry-after"), None, "{what}");
            assert_eq!(e.header("retry-after").is_some(), !e.allowed(), "{what}");
            assert_eq!(s.ratelimit_remaining(), e.ratelimit_remaining(), "{what}");
            if e.allowed() {
                admitted += 1;
            } else {
                would_deny += 1;
                would_deny_units += cost;
            }
        }
        assert!(
            would_deny >= 2 && admitted >= 2,
            "{shape}: both answers seen"
        );
        // A peek answers in shadow too, and is not an acquire to count.
        let e = api.peek(&enforced, "k", 1).await;
        let s = api.peek(&shadowed, "k", 1).await;
        assert!(!e.allowed(), "{}", e.body);
        assert!(s.allowed(), "{}", s.body);
        assert_eq!(s.body["shadow"], true, "{}", s.body);
        assert_eq!(s.body["would_allow"], false, "{}", s.body);
        assert_eq!(s.header("retry-after"), None);

        assert_eq!(
            shadow_denied(&app, &shadowed).await,
            (f64::from(would_deny), would_deny_units as f64),
            "{shape}"
        );
        assert_eq!(shadow_denied(&app, &enforced).await, (0.0, 0.0), "{shape}");
        let decisions = |p: &str, outcome: &str| {
            let (p, outcome) = (p.to_owned(), outcome.to_owned());
            let app = &app;
            async move {
                let labels = [("policy", p.as_str()), ("outcome", outcome.as_str())];
                metric(app, "ratelimiter_decisions_total", &labels).await
            }
        };
        let n = costs.len() as f64;
        assert_eq!(decisions(&shadowed, "allowed").await, n, "{shape}");
        assert_eq!(decisions(&shadowed, "denied").await, 0.0, "{shape}");
        assert_eq!(decisions(&enforced, "denied").await, f64::from(would_deny));
        assert_eq!(operations(&app, &shadowed, "peek").await.0, 1.0, "{shape}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_shadow_setting_puts_an_enforcing_policy_in_shadow_mode() {
    let app = spawn_app_with(None, &[("RATELIMITER__LIMITS__SHADOW", "true")]).await;
    let api = Api::new(&app, Backend::Embedded);
    clear_of_window_edges(&[HOUR_MS]).await;
    app.create_policy(json!({"name": "all-shadow", "algorithm": "fixed_window", "limit": 2, "window_ms": HOUR_MS, "mode": "enforce"}))
        .await;
    let d = api.acquire("all-shadow", "k", 2).await;
    assert_eq!(
        (d.allowed(), d.body["would_allow"].clone()),
        (true, json!(true)),
        "{}",
        d.body
    );
    for d in [
        api.acquire("all-shadow", "k", 1).await,
        api.peek("all-shadow", "k", 1).await,
    ] {
        assert!(d.allowed(), "{}", d.body);
        assert_eq!(d.body["shadow"], true, "{}", d.body);
        assert_eq!(d.body["would_allow"], false, "{}", d.body);
        assert_eq!(d.n("remaining"), 0, "{}", d.body);
        assert!(d.n("retry_after_ms") > 0, "{}", d.body);
        assert_eq!(d.header("retry-after"), None);
        assert_eq!(
            d.ticket(),
            None,
            "a would-be denial takes nothing: {}",
            d.body
        );
    }
}

// ---- 7. Who decided, with Redis stopped ------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_stopped_every_operation_is_answered_by_fail_mode_and_says_so() {
    let redis = Arc::new(TestRedis::start());
    let app = spawn_app_with(
        Some(redis.clone()),
        &[
            ("RATELIMITER__REDIS__TIMEOUT_MS", "250"),
            ("RATELIMITER__REDIS__BREAKER_FAILURES", "3"),
            ("RATELIMITER__REDIS__BREAKER_COOLDOWN_MS", "300"),
            // The refunds below come without a ticket.
            TICKETLESS,
        ],
    )
    .await;
    let modes = ["open", "local", "closed"];
    for mode in modes {
        app.create_policy(json!({"name": format!("settling-{mode}"), "algorithm": "fixed_window", "limit": 5, "window_ms": HOUR_MS, "fail_mode": mode}))
            .await;
    }
    clear_of_window_edges(&[HOUR_MS]).await;

    // Redis up: Redis decides every operation, whatever the fail mode.
    let api = Api::new(&app, Backend::Redis);
    for mode in modes {
        let p = format!("settling-{mode}");
        assert!(api.acquire(&p, "k", 1).await.allowed());
        assert_eq!(api.peek(&p, "k", 1).await.n("remaining"), 4);
        let reported = api.report(&p, "k", 2).await;
        api.refund(&p, "k", 1, reported.ticket().as_deref()).await;
        assert_eq!(reset(&app, &p, "k").await, 204);
    }

    let stopping = redis.clone();
    tokio::task::spawn_blocking(move || stopping.stop())
        .await
        .expect("stop");
    for mode in modes {
        let p = format!("settling-{mode}");
        for (op, cost) in [("acquire", 1), ("peek", 1), ("report", 2), ("refund", 1)] {
            let r = app
                .post(
                    &format!("/v1/{op}"),
                    &json!({"policy": p, "key": "k", "cost": cost}),
                )
                .await;
            let status = r.status();
            let header = r
                .headers()
                .get("decided-by")
                .map(|v| v.to_str().expect("ASCII").to_owned());
            let has_ratelimit = r.headers().get("ratelimit").is_some();
            let d: Value = r.json().await.expect("JSON");
            let what = format!("{mode} {op}: {d}");
            if mode == "closed" {
                assert_eq!(status, 503, "{what}");
                assert_eq!(
                    d["type"], "urn:ratelimiter:problem:store-unavailable",
                    "{what}"
                );
                continue;
            }
            let by = format!("fail_{mode}");
            assert_eq!(status, 200, "{what}");
            assert_eq!(d["decided_by"], by, "{what}");
            assert_eq!(header.as_deref(), Some(by.as_str()), "{what}");
            assert_eq!(d["degraded"], true, "{what}");
            assert_eq!(d["allowed"], true, "{what}");
            match (mode, op) {
                // Nothing was counted: no ticket, nothing given back, no quota claimed.
                ("open", "report") => assert_eq!(d.get("ticket"), None, "{what}"),
                ("open", "refund") => assert_eq!(d["refunded"], 0, "{what}"),
                // This instance's own store: 1 acquired and 2 reported, so 1 comes back.
                ("local", "refund") => assert_eq!(d["refunded"], 1, "{what}"),
                _ => {}
            }
            assert_eq!(has_ratelimit, mode == "local", "{what}");
        }
        // A reset is not a decision: refused whatever the fail mode.
        let r = app
            .post("/v1/reset", &json!({"policy": p, "key": "k"}))
            .await;
        assert_eq!(r.status(), 503, "{mode}");
        let problem: Value = r.json().await.expect("JSON");
        assert_eq!(problem["type"], "urn:ratelimiter:problem:store-unavailable");
    }
}
