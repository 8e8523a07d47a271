//! Concurrency limits over HTTP (issue 12): leases taken with `POST /v1/leases`, renewed with
//! `POST /v1/leases/{id}/renew` and released with `DELETE /v1/leases/{id}`.
//!
//! On every store: exactly `limit` leases among concurrent takes, and exactly as many more as were
//! released; a lease neither renewed nor released frees its slot at its expiry on the store's
//! clock, and is counted as expired; a renewed lease outlives its first expiry, and an expired one
//! is not found; release is idempotent, and a lease id altered by one character finds nothing and
//! touches nothing; a lowered limit keeps the leases held and refuses new ones until enough are
//! released, and a deleted policy forgets its leases. On one Redis: two instances share one limit
//! exactly, and each fail mode answers leases with Redis stopped. On the embedded store (the
//! documents do not depend on the store): the headers, and what is refused.
//!
//! Waits are measured on the store's clock (Redis `TIME`, or this machine's clock for the
//! embedded store). A step that had to happen before an expiry and did not (a busy machine) makes
//! the scenario start again with longer leases, instead of failing: nothing here asserts on speed.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use reqwest::header::HeaderMap;
use serde_json::{json, Value};

use crate::helpers::{masters, metric, spawn_app, spawn_app_with, Backend, TestApp, TestRedis};

crate::on_every_store!(
    concurrent_takes_grant_exactly_the_limit_and_releases_free_exactly_their_slots,
    a_lease_neither_renewed_nor_released_frees_its_slot_at_its_expiry,
    a_renewed_lease_outlives_its_first_expiry_and_an_expired_one_is_not_found,
    release_is_idempotent_and_an_altered_lease_id_finds_nothing_and_touches_nothing,
    a_lowered_limit_keeps_the_leases_held_and_a_deleted_policy_forgets_them,
);

const MINUTE_MS: u64 = 60_000;
const HOUR_MS: u64 = 3_600_000;
const DAY_MS: u64 = 86_400_000;

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

/// A concurrency policy document, whose calls may ask for leases of up to a day (a policy's
/// `max_lease_ms` is its `lease_ms` unless it says otherwise: `lease_hardening`).
fn concurrency(name: &str, limit: u64, lease_ms: u64) -> Value {
    json!({"name": name, "algorithm": "concurrency", "limit": limit, "lease_ms": lease_ms, "max_lease_ms": DAY_MS})
}

/// One answer of the API: its status, headers and JSON body (`null` when empty).
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: HeaderMap,
    body: Value,
}

impl Reply {
    fn n(&self, field: &str) -> u64 {
        self.body[field]
            .as_u64()
            .unwrap_or_else(|| panic!("a number `{field}` in {self}"))
    }

    fn header(&self, name: &str) -> Option<String> {
        self.headers
            .get(name)
            .map(|v| v.to_str().expect("ASCII header").to_owned())
    }

    /// The lease id of a granted take.
    fn lease(&self) -> String {
        self.body["lease"]
            .as_str()
            .unwrap_or_else(|| panic!("a lease id in {self}"))
            .to_owned()
    }

    /// A problem+json answer of `status` whose `type` is `urn:ratelimiter:problem:<kind>`.
    fn is_problem(&self, status: u16, kind: &str) -> bool {
        self.status == status
            && self.header("content-type").as_deref() == Some("application/problem+json")
            && self.body["type"] == format!("urn:ratelimiter:problem:{kind}")
    }

    /// A 422 naming `field`, in `field` and in the detail.
    fn names_field(&self, field: &str) -> bool {
        self.status == 422
            && self.header("content-type").as_deref() == Some("application/problem+json")
            && self.body["field"] == field
            && self.body["detail"]
                .as_str()
                .is_some_and(|d| d.contains(field))
    }
}

impl std::fmt::Display for Reply {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.status, self.body)
    }
}

async fn reply(request: reqwest::RequestBuilder) -> Reply {
    let r = request.send().await.expect("request sent");
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().await.expect("a body");
    let body = if text.is_empty() {
        Value::Null
    } else {
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("a JSON body ({e}): {text}"))
    };
    Reply {
        status,
        headers,
        body,
    }
}

/// The lease API of one app (cheap to clone into tasks), with who must decide its answers:
/// `embedded`, `redis`, `fail_open` or `fail_local`.
#[derive(Clone)]
struct Api {
    client: reqwest::Client,
    address: String,
    by: &'static str,
}

impl Api {
    fn new(app: &TestApp, backend: Backend) -> Self {
        let by = match backend {
            Backend::Embedded => "embedded",
            Backend::Redis | Backend::Cluster => "redis",
        };
        Self::decided_by(app, by)
    }

    fn decided_by(app: &TestApp, by: &'static str) -> Self {
        Self {
            client: app.client.clone(),
            address: app.address.clone(),
            by,
        }
    }

    /// `POST /v1/leases`, any answer.
    async fn take(
        &self,
        policy: &str,
        key: &str,
        cost: Option<u64>,
        lease_ms: Option<u64>,
    ) -> Reply {
        let mut body = json!({"policy": policy, "key": key});
        if let Some(c) = cost {
            body["cost"] = json!(c);
        }
        if let Some(l) = lease_ms {
            body["lease_ms"] = json!(l);
        }
        reply(
            self.client
                .post(format!("{}/v1/leases", self.address))
                .json(&body),
        )
        .await
    }

    /// `POST /v1/leases/{id}/renew`, with no body when `lease_ms` is None; any answer.
    async fn renew(&self, id: &str, lease_ms: Option<u64>) -> Reply {
        let request = self
            .client
            .post(format!("{}/v1/leases/{id}/renew", self.address));
        let request = match lease_ms {
            Some(l) => request.json(&json!({"lease_ms": l})),
            None => request,
        };
        reply(request).await
    }

    /// `DELETE /v1/leases/{id}`, any answer.
    async fn release(&self, id: &str) -> Reply {
        reply(
            self.client
                .delete(format!("{}/v1/leases/{id}", self.address)),
        )
        .await
    }

    /// Checks what every lease answer of a live decision carries: who decided, in the body and
    /// `Decided-By`, and whether that is degraded.
    fn check_decided(&self, r: &Reply, what: &str) {
        assert_eq!(r.body["decided_by"], self.by, "{what}: {r}");
        assert_eq!(
            r.header("decided-by").as_deref(),
            Some(self.by),
            "{what}: {r}"
        );
        assert_eq!(
            r.body["degraded"],
            self.by.starts_with("fail_"),
            "{what}: {r}"
        );
    }

    /// `in_use` and `remaining` agree with `limit` (remaining is never below 0). Not on a
    /// `fail_open` answer, which counted nothing.
    fn check_counts(&self, r: &Reply, what: &str) {
        if self.by == "fail_open" {
            return;
        }
        assert_eq!(
            r.n("remaining"),
            r.n("limit").saturating_sub(r.n("in_use")),
            "{what}: {r}"
        );
    }

    /// A granted take: 201, a lease id in the body and in `Location`, an expiry within the
    /// lease's lifetime, no wait.
    fn check_granted(&self, r: &Reply, policy: &str, key: &str, lease_ms: u64) {
        let what = format!("take {policy}/{key}");
        assert_eq!(r.status, 201, "{what}: {r}");
        assert_eq!(r.body["allowed"], true, "{what}: {r}");
        let id = r.lease();
        assert_eq!(
            r.header("location"),
            Some(format!("/v1/leases/{id}")),
            "{what}: {r}"
        );
        assert_eq!(
            (&r.body["policy"], &r.body["key"]),
            (&json!(policy), &json!(key)),
            "{what}: {r}"
        );
        let expires = r.n("expires_in_ms");
        assert!(expires > 0 && expires <= lease_ms, "{what}: {r}");
        assert_eq!(r.n("retry_after_ms"), 0, "{what}: {r}");
        assert_eq!(r.header("retry-after"), None, "{what}: {r}");
        self.check_decided(r, &what);
        self.check_counts(r, &what);
    }

    /// A denied take: 200, no lease, a wait of at most `longest_ms` (the longest lease held), and
    /// `Retry-After` as that wait in whole seconds rounded up.
    fn check_denied(&self, r: &Reply, policy: &str, key: &str, longest_ms: u64) {
        let what = format!("take {policy}/{key}");
        assert_eq!(r.status, 200, "{what}: {r}");
        assert_eq!(r.body["allowed"], false, "{what}: {r}");
        assert_eq!(r.body.get("lease"), None, "{what}: {r}");
        assert_eq!(r.header("location"), None, "{what}: {r}");
        assert_eq!(
            (&r.body["policy"], &r.body["key"]),
            (&json!(policy), &json!(key)),
            "{what}: {r}"
        );
        assert_eq!(r.n("expires_in_ms"), 0, "{what}: {r}");
        let wait = r.n("retry_after_ms");
        assert!(wait > 0 && wait <= longest_ms, "{what}: {r}");
        assert_eq!(
            r.header("retry-after"),
            Some(wait.div_ceil(1_000).max(1).to_string()),
            "{what}: {r}"
        );
        self.check_decided(r, &what);
        self.check_counts(r, &what);
    }

    /// A take of `cost` for `lease_ms` that must be granted, with the answer checked.
    async fn granted(&self, policy: &str, key: &str, cost: u64, lease_ms: u64) -> Reply {
        let r = self.take(policy, key, Some(cost), Some(lease_ms)).await;
        self.check_granted(&r, policy, key, lease_ms);
        r
    }

    /// A take of one unit that must be denied, the longest lease held being `longest_ms`.
    async fn denied(&self, policy: &str, key: &str, longest_ms: u64) -> Reply {
        let r = self.take(policy, key, Some(1), None).await;
        self.check_denied(&r, policy, key, longest_ms);
        r
    }

    /// A successful renewal: 200, the same lease, an expiry within `longest_ms`.
    fn check_renewed(&self, r: &Reply, id: &str, longest_ms: u64) {
        let what = format!("renew {id}");
        assert_eq!(r.status, 200, "{what}: {r}");
        assert_eq!(r.body["lease"], id, "{what}: {r}");
        let expires = r.n("expires_in_ms");
        assert!(expires > 0 && expires <= longest_ms, "{what}: {r}");
        self.check_decided(r, &what);
        self.check_counts(r, &what);
    }

    /// A renewal that must succeed, for `lease_ms` (None: the policy's), of at most
    /// `longest_ms`.
    async fn renewed(&self, id: &str, lease_ms: Option<u64>, longest_ms: u64) -> Reply {
        let r = self.renew(id, lease_ms).await;
        self.check_renewed(&r, id, longest_ms);
        r
    }

    /// A renewal of a lease that is not live: 404 `unknown-lease`.
    async fn not_found(&self, id: &str) {
        let r = self.renew(id, None).await;
        assert!(r.is_problem(404, "unknown-lease"), "renew {id}: {r}");
    }

    /// A release that must be accepted: 204, empty.
    async fn released(&self, id: &str) {
        let r = self.release(id).await;
        assert_eq!(r.status, 204, "release {id}: {r}");
        assert_eq!(r.body, Value::Null, "release {id}: {r}");
    }

    /// `n` concurrent takes of one unit each, with the policy's lease_ms.
    async fn crowd(&self, policy: &str, key: &str, n: usize) -> Vec<Reply> {
        let takes = (0..n).map(|_| {
            let (api, policy, key) = (self.clone(), policy.to_owned(), key.to_owned());
            tokio::spawn(async move { api.take(&policy, &key, None, None).await })
        });
        join_all(takes)
            .await
            .into_iter()
            .map(|r| r.expect("task"))
            .collect()
    }
}

/// Splits concurrent takes into the granted and the denied, checking each.
fn split<'r>(
    apis: &[&Api],
    answers: &'r [Reply],
    policy: &str,
    key: &str,
    lease_ms: u64,
) -> (Vec<&'r Reply>, Vec<&'r Reply>) {
    let (granted, denied): (Vec<&Reply>, Vec<&Reply>) =
        answers.iter().partition(|r| r.status == 201);
    for (i, r) in answers.iter().enumerate() {
        let api = apis[i % apis.len()];
        if r.status == 201 {
            api.check_granted(r, policy, key, lease_ms);
        } else {
            api.check_denied(r, policy, key, lease_ms);
        }
    }
    (granted, denied)
}

/// The store's clock in ms: Redis `TIME` (a cluster's first node: every node runs on this
/// machine's clock), or this machine's clock, which the embedded store reads.
fn store_now_ms(app: &TestApp) -> u64 {
    let node = app
        ._redis
        .as_deref()
        .or_else(|| app.cluster.as_ref().map(|c| &c.nodes()[0]));
    match node {
        Some(n) => {
            let (s, us): (u64, u64) = ::redis::cmd("TIME")
                .query(&mut n.conn())
                .expect("Redis TIME");
            s * 1_000 + us / 1_000
        }
        None => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("the clock is after 1970")
            .as_millis() as u64,
    }
}

/// Waits until the store's clock reads `at_ms` or later.
async fn wait_for_store_clock(app: &TestApp, at_ms: u64) {
    loop {
        let now = store_now_ms(app);
        if now >= at_ms {
            return;
        }
        tokio::time::sleep(Duration::from_millis(at_ms - now)).await;
    }
}

/// Every Redis key of `policy`'s subject `key` (for the keys used here, which need no
/// escaping), with its absolute expiry (`PEXPIRETIME`, ms); None on the embedded store.
fn subject_keys(app: &TestApp, policy: &str, key: &str) -> Option<Vec<(String, i64)>> {
    let mut found = Vec::new();
    for mut conn in masters(app)? {
        let keys: Vec<String> = ::redis::cmd("KEYS")
            .arg(format!("rl:{{{policy}@*}}:lease:{key}"))
            .query(&mut conn)
            .expect("KEYS");
        for k in keys {
            let expiry: i64 = ::redis::cmd("PEXPIRETIME")
                .arg(&k)
                .query(&mut conn)
                .expect("PEXPIRETIME");
            found.push((k, expiry));
        }
    }
    Some(found)
}

/// `ratelimiter_leases_total{policy, event}` for each event, in the order
/// granted, denied, renewed, released, expired; and the gauge `ratelimiter_leases_in_use`.
async fn lease_metrics(app: &TestApp, policy: &str) -> ([f64; 5], f64) {
    let mut events = [0.0; 5];
    for (i, event) in ["granted", "denied", "renewed", "released", "expired"]
        .iter()
        .enumerate()
    {
        events[i] = metric(
            app,
            "ratelimiter_leases_total",
            &[("policy", policy), ("event", event)],
        )
        .await;
    }
    let in_use = metric(app, "ratelimiter_leases_in_use", &[("policy", policy)]).await;
    (events, in_use)
}

/// Waits (10 s at most) until `ratelimiter_leases_in_use{policy}` reads `value`.
async fn gauge_comes_to(app: &TestApp, policy: &str, value: f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let gauge = lease_metrics(app, policy).await.1;
        if gauge == value {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "the gauge stayed at {gauge}, not {value}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// base64url without padding, as the lease id carries the key.
fn b64url(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |n, (i, b)| n | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..=chunk.len() {
            out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
        }
    }
    out
}

/// The five parts of a lease id, checked against the form
/// `l1~<policy>~<base64url(key)>~<32 lowercase hex>~<cost>`.
fn id_parts(id: &str, policy: &str, key: &str, cost: u64) -> Vec<String> {
    let parts: Vec<String> = id.split('~').map(str::to_owned).collect();
    assert_eq!(parts.len(), 5, "{id}");
    assert_eq!(parts[0], "l1", "{id}");
    assert_eq!(parts[1], policy, "{id}");
    assert_eq!(parts[2], b64url(key.as_bytes()), "{id}");
    assert!(
        parts[3].len() == 32
            && parts[3]
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
        "{id}"
    );
    assert_eq!(parts[4], cost.to_string(), "{id}");
    parts
}

/// `id` with part `i` replaced.
fn with_part(parts: &[String], i: usize, part: &str) -> String {
    let mut parts = parts.to_vec();
    parts[i] = part.to_owned();
    parts.join("~")
}

/// `s` with its character at `at` replaced by `c`.
fn with_char(s: &str, at: usize, c: char) -> String {
    s.char_indices()
        .map(|(i, old)| if i == at { c } else { old })
        .collect()
}

// ---- 1. Exactly the limit under concurrency ---------------------------------------------------

async fn concurrent_takes_grant_exactly_the_limit_and_releases_free_exactly_their_slots(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    let api = Api::new(&app, backend);
    let p = format!("{}-crowd", tag(backend));
    app.create_policy(concurrency(&p, 5, MINUTE_MS)).await;

    let answers = api.crowd(&p, "hot", 200).await;
    let (granted, denied) = split(&[&api], &answers, &p, "hot", MINUTE_MS);
    assert_eq!(granted.len(), 5, "exactly the limit");
    assert_eq!(denied.len(), 195);
    // Each grant was one atomic step: in use after it 1, 2, …, 5, each lease its own.
    let in_use: BTreeSet<u64> = granted.iter().map(|r| r.n("in_use")).collect();
    assert_eq!(in_use, (1..=5).collect());
    let ids: BTreeSet<String> = granted.iter().map(|r| r.lease()).collect();
    assert_eq!(ids.len(), 5, "five distinct leases");
    for r in &denied {
        assert_eq!((r.n("limit"), r.n("in_use")), (5, 5), "{r}");
    }

    for id in ids.iter().take(2) {
        api.released(id).await;
    }
    let answers = api.crowd(&p, "hot", 200).await;
    let (granted, denied) = split(&[&api], &answers, &p, "hot", MINUTE_MS);
    assert_eq!(granted.len(), 2, "exactly the two released slots");
    assert_eq!(denied.len(), 198);
    let in_use: BTreeSet<u64> = granted.iter().map(|r| r.n("in_use")).collect();
    assert_eq!(in_use, BTreeSet::from([4, 5]));
    let new_ids: BTreeSet<String> = granted.iter().map(|r| r.lease()).collect();
    assert!(new_ids.is_disjoint(&ids), "new leases, not old ids again");

    let (events, gauge) = lease_metrics(&app, &p).await;
    assert_eq!(events, [7.0, 393.0, 0.0, 2.0, 0.0], "granted, denied, …");
    assert_eq!(gauge, 5.0, "leases in use");
}

// ---- 2. Expiry -------------------------------------------------------------------------------

async fn a_lease_neither_renewed_nor_released_frees_its_slot_at_its_expiry(backend: Backend) {
    let app = spawn_app(backend).await;
    let api = Api::new(&app, backend);
    for lease_ms in [400, 1_600, 6_400] {
        if expiry_frees_the_slot(&app, &api, backend, lease_ms).await {
            return;
        }
        eprintln!("a step came after an expiry it had to precede: again, with longer leases");
    }
    panic!("the machine was too slow for every attempt, even with leases of 6.4 s");
}

/// One attempt with leases of `lease_ms`; false when a step meant to come before the expiry came
/// after it.
async fn expiry_frees_the_slot(app: &TestApp, api: &Api, backend: Backend, lease_ms: u64) -> bool {
    // A policy per attempt, so that each counts its own.
    let p = format!("{}-expiry-{lease_ms}", tag(backend));
    app.create_policy(concurrency(&p, 2, lease_ms)).await;

    // A short lease (the policy's) and a long one: the long one keeps the subject alive, so the
    // short one's expiry is found by the next take, not removed by Redis with its key.
    let t0 = store_now_ms(app);
    let short = api.take(&p, "k", None, None).await;
    api.check_granted(&short, &p, "k", lease_ms);
    let long = api.granted(&p, "k", 1, MINUTE_MS).await;
    let t1 = store_now_ms(app);
    assert_eq!(long.n("in_use"), 2, "{long}");
    // The short lease expires in [t0, t1] + lease_ms, the long one in [t0, t1] + 1 min.
    if let Some(keys) = subject_keys(app, &p, "k") {
        assert_eq!(keys.len(), 1, "one key per subject: {keys:?}");
        assert!(keys[0].0.ends_with(":lease:k"), "{keys:?}");
        let expiry = keys[0].1 as u64;
        assert!(
            (t0 + MINUTE_MS..=t1 + MINUTE_MS + 1).contains(&expiry),
            "the key expires with its last lease: {expiry} not in [{t0}, {t1}] + 1 min"
        );
    }

    // Right away: the limit is held.
    let d = api.take(&p, "k", None, None).await;
    let t2 = store_now_ms(app);
    if t2 >= t0 + lease_ms {
        return false;
    }
    api.check_denied(&d, &p, "k", lease_ms);
    // The wait is until the short lease's expiry: at most lease_ms, and no earlier than it.
    assert!(
        d.n("retry_after_ms") + (t2 - t0) + 1 >= lease_ms,
        "waits until {} ms after {t0} at the earliest: {d}",
        lease_ms
    );

    // After the short lease's expiry, on the store's clock: its slot is free.
    wait_for_store_clock(app, t1 + lease_ms + 50).await;
    // For a minute, so that on a slow machine it cannot expire too before the counts are read.
    let again = api.granted(&p, "k", 1, MINUTE_MS).await;
    assert_eq!(again.n("in_use"), 2, "the long lease and this one: {again}");
    api.not_found(&short.lease()).await;
    let (events, gauge) = lease_metrics(app, &p).await;
    assert_eq!(
        events,
        [3.0, 1.0, 0.0, 0.0, 1.0],
        "granted, denied, renewed, released, expired"
    );
    assert_eq!(gauge, 2.0, "3 granted, 1 expired");

    // The last leases released: nothing is left of the subject.
    api.released(&long.lease()).await;
    api.released(&again.lease()).await;
    if let Some(keys) = subject_keys(app, &p, "k") {
        assert_eq!(keys, vec![], "the key goes with its last lease");
    }
    assert_eq!(lease_metrics(app, &p).await.1, 0.0);

    // A lone lease that nobody renews, releases or meets again: its subject's key goes with
    // it, and the sweep still counts its expiry, once, and takes it out of the gauge.
    let before_lone = store_now_ms(app);
    let lone = api.take(&p, "lone", None, None).await;
    api.check_granted(&lone, &p, "lone", lease_ms);
    let t3 = store_now_ms(app);
    let gauge = lease_metrics(app, &p).await.1;
    if store_now_ms(app) >= before_lone + lease_ms {
        // Read after the lone lease may have expired: the gauge proves nothing.
        return false;
    }
    assert_eq!(gauge, 1.0, "the lone lease is held");
    wait_for_store_clock(app, t3 + lease_ms + 50).await;
    if let Some(keys) = subject_keys(app, &p, "lone") {
        assert_eq!(keys, vec![], "the key went with its lease");
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (events, gauge) = lease_metrics(app, &p).await;
        if events[4] == 2.0 && gauge == 0.0 {
            break;
        }
        assert_eq!(events[4], 1.0, "counted once: {events:?}");
        assert!(
            Instant::now() < deadline,
            "the lone lease's expiry was never counted: {events:?}, gauge {gauge}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    true
}

// ---- 3. Renewal ------------------------------------------------------------------------------

async fn a_renewed_lease_outlives_its_first_expiry_and_an_expired_one_is_not_found(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    let api = Api::new(&app, backend);
    for lease_ms in [500, 2_000, 8_000] {
        if renewal_outlives_the_first_expiry(&app, &api, backend, lease_ms).await {
            return;
        }
        eprintln!("a step came after an expiry it had to precede: again, with longer leases");
    }
    panic!("the machine was too slow for every attempt, even with leases of 8 s");
}

/// One attempt with leases of `lease_ms`; false when a step meant to come before an expiry came
/// after it.
async fn renewal_outlives_the_first_expiry(
    app: &TestApp,
    api: &Api,
    backend: Backend,
    lease_ms: u64,
) -> bool {
    let p = format!("{}-renew-{lease_ms}", tag(backend));
    app.create_policy(concurrency(&p, 1, lease_ms)).await;
    let longer = 4 * lease_ms;

    let t0 = store_now_ms(app);
    let lease = api.take(&p, "k", None, None).await;
    api.check_granted(&lease, &p, "k", lease_ms);
    let id = lease.lease();
    // Renewed before its first expiry, for longer.
    let r = api.renew(&id, Some(longer)).await;
    let t1 = store_now_ms(app);
    if r.status == 404 && t1 >= t0 + lease_ms {
        return false;
    }
    api.check_renewed(&r, &id, longer);
    assert_eq!((r.n("in_use"), r.n("remaining")), (1, 0), "{r}");
    assert!(
        r.n("expires_in_ms") > lease_ms,
        "renewed from now for {longer} ms: {r}"
    );

    // Past the first expiry: still held, and renewable again.
    wait_for_store_clock(app, t1 + lease_ms + 50).await;
    let d = api.take(&p, "k", None, None).await;
    let t2 = store_now_ms(app);
    if t2 >= t0 + longer {
        return false;
    }
    api.check_denied(&d, &p, "k", longer);
    assert_eq!(d.n("in_use"), 1, "{d}");
    let r = api.renew(&id, None).await;
    let t3 = store_now_ms(app);
    if r.status == 404 && t3 >= t0 + longer {
        return false;
    }
    api.check_renewed(&r, &id, lease_ms);
    assert!(
        (1..=lease_ms).contains(&r.n("expires_in_ms")),
        "renewed for the policy's lease_ms: {r}"
    );

    // Not renewed again: expired, not found, and its slot free.
    wait_for_store_clock(app, t3 + lease_ms + 50).await;
    api.not_found(&id).await;
    let again = api.granted(&p, "k", 1, lease_ms).await;
    assert_eq!(again.n("in_use"), 1, "{again}");
    let ([granted, denied, renewed, released, _], _) = lease_metrics(app, &p).await;
    assert_eq!(
        (granted, denied, renewed, released),
        (2.0, 1.0, 2.0, 0.0),
        "granted, denied, renewed, released"
    );
    true
}

// ---- 4. Release and altered ids --------------------------------------------------------------

async fn release_is_idempotent_and_an_altered_lease_id_finds_nothing_and_touches_nothing(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    let api = Api::new(&app, backend);
    let t = tag(backend);
    // Two policies whose names differ in one character, so that an id altered there names a
    // real policy.
    let (p, q) = (format!("{t}-alter-a"), format!("{t}-alter-b"));
    app.create_policy(concurrency(&p, 5, MINUTE_MS)).await;
    app.create_policy(concurrency(&q, 5, MINUTE_MS)).await;

    // "key" is "a2V5" in base64url; with its first character one further, "b2V5", it is "oey".
    let key = "key";
    let other_key = "oey";
    assert_eq!(
        b64url(other_key.as_bytes()),
        with_char(&b64url(b"key"), 0, 'b')
    );
    let lease = api.granted(&p, key, 2, MINUTE_MS).await;
    let id = lease.lease();
    let parts = id_parts(&id, &p, key, 2);
    let hex = &parts[3];
    let flipped = if hex.starts_with('0') { '1' } else { '0' };
    let at = p.len() - 1;

    // Each is one character away from the real id. Another lease: a renewal finds nothing and
    // a release is accepted; not a lease id: both 404.
    let another = [
        (
            "another random part",
            with_part(&parts, 3, &with_char(hex, 0, flipped)),
        ),
        (
            "another key",
            with_part(&parts, 2, &b64url(other_key.as_bytes())),
        ),
        ("another cost", with_part(&parts, 4, "3")),
        (
            "another policy",
            with_part(&parts, 1, &with_char(&p, at, 'b')),
        ),
    ];
    let malformed = [
        (
            "a random part not hex",
            with_part(&parts, 3, &with_char(hex, 5, 'g')),
        ),
        ("a random part too short", with_part(&parts, 3, &hex[1..])),
        (
            "a key not base64url",
            with_part(&parts, 2, &with_char(&parts[2], 1, '*')),
        ),
        ("a cost not a number", with_part(&parts, 4, "x")),
        ("another version", with_part(&parts, 0, "l2")),
        ("a separator changed", id.replacen('~', "-", 1)),
        (
            "no cost",
            id[..id.rfind('~').expect("a separator")].to_owned(),
        ),
        ("not a lease id at all", "garbage".to_owned()),
    ];
    for (what, altered) in &another {
        assert_ne!(altered, &id, "{what}");
        let r = api.renew(altered, None).await;
        assert!(
            r.is_problem(404, "unknown-lease"),
            "{what}: renew {altered}: {r}"
        );
        let r = api.release(altered).await;
        assert_eq!(r.status, 204, "{what}: release {altered}: {r}");
        let r = api.renewed(&id, None, MINUTE_MS).await;
        assert_eq!(r.n("in_use"), 2, "{what}: the real lease is untouched: {r}");
    }
    for (what, altered) in &malformed {
        let r = api.renew(altered, None).await;
        assert!(
            r.is_problem(404, "unknown-lease"),
            "{what}: renew {altered}: {r}"
        );
        let r = api.release(altered).await;
        assert_eq!(r.status, 404, "{what}: release {altered}: {r}");
        let r = api.renewed(&id, None, MINUTE_MS).await;
        assert_eq!(r.n("in_use"), 2, "{what}: the real lease is untouched: {r}");
    }
    // Nothing was written for the subjects the altered ids named: their whole limit is free.
    if let Some(keys) = subject_keys(&app, &p, other_key) {
        assert_eq!(keys, vec![], "no state for {other_key}");
    }
    if let Some(keys) = subject_keys(&app, &q, key) {
        assert_eq!(keys, vec![], "no state for {q}");
    }
    for (policy, k) in [(&p, other_key), (&q, key)] {
        let full = api.granted(policy, k, 5, MINUTE_MS).await;
        assert_eq!(full.n("in_use"), 5, "{full}");
        api.released(&full.lease()).await;
    }

    // A key any string may be: the id stays URL-path safe.
    let odd = "a/b c~é?#%2F..";
    let r = api.granted(&p, odd, 1, MINUTE_MS).await;
    let odd_id = r.lease();
    id_parts(&odd_id, &p, odd, 1);
    let renewed = api.renewed(&odd_id, Some(1_000), 1_000).await;
    assert_eq!(renewed.body["key"], odd, "{renewed}");
    api.released(&odd_id).await;

    // Released twice: accepted twice, and then not found.
    api.released(&id).await;
    api.released(&id).await;
    api.not_found(&id).await;
    if let Some(keys) = subject_keys(&app, &p, key) {
        assert_eq!(keys, vec![], "the key goes with its last lease");
    }
    let free = api.granted(&p, key, 5, MINUTE_MS).await;
    assert_eq!(free.n("in_use"), 5, "{free}");
    api.released(&free.lease()).await;

    // Only live leases were counted as released: the gauge is back to 0, never below.
    let (events, gauge) = lease_metrics(&app, &p).await;
    assert_eq!(events[0], 4.0, "granted");
    assert_eq!(events[3], 4.0, "released (live ones only)");
    assert_eq!(gauge, 0.0);
    assert_eq!(lease_metrics(&app, &q).await.1, 0.0);
}

// ---- 6. Lowering the limit, deleting the policy ----------------------------------------------

async fn a_lowered_limit_keeps_the_leases_held_and_a_deleted_policy_forgets_them(backend: Backend) {
    let app = spawn_app(backend).await;
    let api = Api::new(&app, backend);
    let p = format!("{}-lowered", tag(backend));
    app.create_policy(concurrency(&p, 5, MINUTE_MS)).await;
    let mut ids = Vec::new();
    for held in 1..=5 {
        let r = api.granted(&p, "k", 1, MINUTE_MS).await;
        assert_eq!(r.n("in_use"), held, "{r}");
        ids.push(r.lease());
    }

    let r = app
        .put(
            &format!("/v1/policies/{p}"),
            &json!({"algorithm": "concurrency", "limit": 2, "lease_ms": MINUTE_MS}),
        )
        .await;
    assert_eq!(r.status(), 200, "replaced");
    // The five leases are still held (and renewable); no new one until in use is below 2.
    let r = api.renewed(&ids[0], None, MINUTE_MS).await;
    assert_eq!(
        (r.n("limit"), r.n("in_use"), r.n("remaining")),
        (2, 5, 0),
        "{r}"
    );
    let d = api.denied(&p, "k", MINUTE_MS).await;
    assert_eq!((d.n("limit"), d.n("in_use")), (2, 5), "{d}");
    for (i, id) in ids[..4].iter().enumerate() {
        let d = api.denied(&p, "k", MINUTE_MS).await;
        assert_eq!(d.n("in_use"), 5 - i as u64, "{d}");
        api.released(id).await;
    }
    let r = api.granted(&p, "k", 1, MINUTE_MS).await;
    assert_eq!(
        (r.n("limit"), r.n("in_use"), r.n("remaining")),
        (2, 2, 0),
        "{r}"
    );
    api.denied(&p, "k", MINUTE_MS).await;

    // Deleted: its leases are unknown, and so is the policy.
    assert_eq!(app.delete(&format!("/v1/policies/{p}")).await.status(), 204);
    let r = api.renew(&ids[4], None).await;
    assert!(r.is_problem(404, "unknown-policy"), "{r}");
    let r = api.take(&p, "k", None, None).await;
    assert!(r.is_problem(404, "unknown-policy"), "{r}");
    let r = api.release(&ids[4]).await;
    assert_eq!(r.status, 204, "a release is idempotent: {r}");
    // Every instance's sweep, once a second, zeroes a deleted policy's gauge.
    gauge_comes_to(&app, &p, 0.0).await;

    // Created again under the same name: the old leases stay unknown, and hold no slot.
    app.create_policy(concurrency(&p, 2, MINUTE_MS)).await;
    let r = api.renew(&ids[4], None).await;
    assert!(r.is_problem(404, "unknown-lease"), "{r}");
    for held in 1..=2 {
        let r = api.granted(&p, "k", 1, MINUTE_MS).await;
        assert_eq!(r.n("in_use"), held, "{r}");
    }
    api.denied(&p, "k", MINUTE_MS).await;
    assert_eq!(lease_metrics(&app, &p).await.1, 2.0, "the new policy's two");
}

// ---- 5. Two instances ------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_on_one_redis_share_one_concurrency_limit_exactly() {
    let redis = Arc::new(TestRedis::start());
    let a = spawn_app_with(Some(redis.clone()), &[]).await;
    let b = spawn_app_with(Some(redis.clone()), &[]).await;
    let (api_a, api_b) = (Api::decided_by(&a, "redis"), Api::decided_by(&b, "redis"));
    let p = "shared-leases";
    a.create_policy(concurrency(p, 5, MINUTE_MS)).await;
    // Until b's policy cache has it, b answers `unknown-policy`: a renewal of a lease that
    // never existed says when it does, writing nothing.
    let never = format!("l1~{p}~{}~{}~1", b64url(b"k"), "0".repeat(32));
    let start = Instant::now();
    loop {
        let r = api_b.renew(&never, None).await;
        if r.is_problem(404, "unknown-lease") {
            break;
        }
        assert!(r.is_problem(404, "unknown-policy"), "{r}");
        assert!(start.elapsed() < Duration::from_secs(5), "b never saw {p}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    let takes = (0..200).map(|i| {
        let api = if i % 2 == 0 {
            api_a.clone()
        } else {
            api_b.clone()
        };
        tokio::spawn(async move { api.take(p, "k", None, None).await })
    });
    let answers: Vec<Reply> = join_all(takes)
        .await
        .into_iter()
        .map(|r| r.expect("task"))
        .collect();
    let (granted, _) = split(&[&api_a, &api_b], &answers, p, "k", MINUTE_MS);
    assert_eq!(
        granted.len(),
        5,
        "both instances together grant exactly the limit"
    );
    let in_use: BTreeSet<u64> = granted.iter().map(|r| r.n("in_use")).collect();
    assert_eq!(in_use, (1..=5).collect());

    // A lease granted by one instance is renewed and released by the other.
    let of_a = answers
        .iter()
        .step_by(2)
        .find(|r| r.status == 201)
        .map(|r| r.lease());
    let of_b = answers
        .iter()
        .skip(1)
        .step_by(2)
        .find(|r| r.status == 201)
        .map(|r| r.lease());
    let (first, second) = match (of_a, of_b) {
        (Some(x), Some(y)) => (x, y),
        // All five went through one instance: any two of them.
        _ => (granted[0].lease(), granted[1].lease()),
    };
    let r = api_b.renewed(&first, None, MINUTE_MS).await;
    assert_eq!(r.n("in_use"), 5, "{r}");
    api_b.released(&first).await;
    let r = api_a.renewed(&second, None, MINUTE_MS).await;
    assert_eq!(r.n("in_use"), 4, "{r}");

    let takes = (0..40).map(|i| {
        let api = if i % 2 == 0 {
            api_a.clone()
        } else {
            api_b.clone()
        };
        tokio::spawn(async move { api.take(p, "k", None, None).await })
    });
    let answers: Vec<Reply> = join_all(takes)
        .await
        .into_iter()
        .map(|r| r.expect("task"))
        .collect();
    let (granted, _) = split(&[&api_a, &api_b], &answers, p, "k", MINUTE_MS);
    assert_eq!(granted.len(), 1, "exactly the released slot");
    // The two instances share one process, so the gauge sums over both.
    assert_eq!(lease_metrics(&a, p).await.1, 5.0);
}

// ---- 7. Fail modes ---------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_redis_stopped_leases_are_answered_by_their_policys_fail_mode() {
    // A Redis that keeps its data (the policies, and the leases it held) across its restart.
    let dir = std::env::temp_dir().join(format!("ratelimiter-leases-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let dir_arg = dir.to_string_lossy().into_owned();
    let redis = Arc::new(TestRedis::start_with(&[
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
        "--dir",
        &dir_arg,
    ]));
    let app = spawn_app_with(
        Some(redis.clone()),
        &[
            ("RATELIMITER__REDIS__TIMEOUT_MS", "250"),
            ("RATELIMITER__REDIS__BREAKER_FAILURES", "3"),
            ("RATELIMITER__REDIS__BREAKER_COOLDOWN_MS", "300"),
        ],
    )
    .await;
    let modes = ["open", "local", "closed"];
    let mut before = Vec::new();
    let on_redis = Api::decided_by(&app, "redis");
    for mode in modes {
        let p = format!("leases-{mode}");
        let mut policy = concurrency(&p, 2, MINUTE_MS);
        policy["fail_mode"] = json!(mode);
        app.create_policy(policy).await;
        before.push(on_redis.granted(&p, "k", 1, MINUTE_MS).await.lease());
    }

    let stopping = redis.clone();
    tokio::task::spawn_blocking(move || stopping.stop())
        .await
        .expect("stop");

    // open: everything granted, renewed and released, degraded, without the store.
    let open = Api::decided_by(&app, "fail_open");
    let mut open_ids = Vec::new();
    for _ in 0..3 {
        let r = open.granted("leases-open", "k", 1, MINUTE_MS).await;
        open_ids.push(r.lease());
    }
    for id in open_ids.iter().chain([&before[0]]) {
        open.renewed(id, None, MINUTE_MS).await;
    }
    open.released(&open_ids[2]).await;
    open.released(&before[0]).await;

    // local: this instance's own store decides, and its limit holds.
    let local = Api::decided_by(&app, "fail_local");
    let first = local.granted("leases-local", "k", 1, MINUTE_MS).await;
    let second = local.granted("leases-local", "k", 1, MINUTE_MS).await;
    assert_eq!((first.n("in_use"), second.n("in_use")), (1, 2));
    let d = local.denied("leases-local", "k", MINUTE_MS).await;
    assert_eq!(d.n("in_use"), 2, "{d}");
    let r = local.renewed(&first.lease(), None, MINUTE_MS).await;
    assert_eq!(r.n("in_use"), 2, "{r}");
    local.released(&first.lease()).await;
    let third = local.granted("leases-local", "k", 1, MINUTE_MS).await;
    assert_eq!(third.n("in_use"), 2, "{third}");
    local.denied("leases-local", "k", MINUTE_MS).await;
    // A lease taken on Redis before the outage is unknown to this instance's own store: its
    // renewal succeeds degraded, as `open`'s would, rather than telling a live holder its lease
    // is gone.
    let r = open.renewed(&before[1], None, MINUTE_MS).await;
    assert_eq!(r.body["degraded"], true, "{r}");

    // closed: refused, release included (the client retries; the lease expires anyway).
    let closed = Api::decided_by(&app, "redis");
    for r in [
        closed.take("leases-closed", "k", None, None).await,
        closed.renew(&before[2], None).await,
        closed.release(&before[2]).await,
    ] {
        assert!(r.is_problem(503, "store-unavailable"), "{r}");
    }

    // Redis back: a fail-open lease was never stored, so it is not found.
    redis.restart();
    let start = Instant::now();
    loop {
        let r = closed.take("leases-closed", "warm", None, None).await;
        if r.status == 201 {
            closed.check_granted(&r, "leases-closed", "warm", MINUTE_MS);
            break;
        }
        assert!(r.status == 503, "{r}");
        assert!(
            start.elapsed() < Duration::from_secs(8),
            "Redis decides again within 8 s"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // A connection that died with the old Redis is found dead by its next call (answered by fail
    // mode): renew until Redis answers.
    loop {
        let r = open.renew(&open_ids[0], None).await;
        if r.status == 200 && r.body["degraded"] == true {
            assert!(
                start.elapsed() < Duration::from_secs(8),
                "still degraded: {r}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        assert!(r.is_problem(404, "unknown-lease"), "{r}");
        break;
    }
    // Redis kept the leases it held: the closed policy's. The open policy's one, whose release
    // during the outage was answered without Redis, is released on Redis once it answers (the
    // undo queue), so its holder's slot is not held for the rest of its lease.
    let r = closed.renewed(&before[2], None, MINUTE_MS).await;
    assert_eq!(r.n("in_use"), 1, "the one taken before the outage: {r}");
    loop {
        let r = on_redis.renew(&before[0], None).await;
        if r.is_problem(404, "unknown-lease") {
            break;
        }
        assert_eq!(r.status, 200, "{r}");
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "the release answered during the outage was not done on Redis: {r}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let _ = std::fs::remove_dir_all(dir);
}

// ---- 8. Headers and refusals -----------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_take_that_got_no_answer_leaves_no_slot_held_by_nobody() {
    // A hung Redis: the take is sent, no answer comes within the deadline, and Redis runs it
    // when it wakes, granting the only slot to a lease nobody was given. The service queued
    // its release (src/service/undo.rs), which frees the slot once Redis runs it: not held for
    // the lease's hour. Until then the slot is held, and a take is denied: the release is sent
    // when the undo queue next drains, often after a take sent at once; and a release that
    // reached Redis before the take it undoes (on another connection) found nothing, and is
    // sent again only after the take's deadline (`redis.timeout_ms` + 1 s after it was asked,
    // `TAKE_DEADLINE_SLACK_US`). Both orders happen on a busy machine.
    let redis = Arc::new(TestRedis::start());
    let app = spawn_app_with(
        Some(redis.clone()),
        &[
            ("RATELIMITER__REDIS__TIMEOUT_MS", "250"),
            ("RATELIMITER__REDIS__BREAKER_FAILURES", "100"),
        ],
    )
    .await;
    let mut policy = concurrency("ghost", 1, HOUR_MS);
    policy["fail_mode"] = json!("closed");
    app.create_policy(policy).await;
    let api = Api::decided_by(&app, "redis");

    redis.signal("STOP");
    let r = api.take("ghost", "k", None, None).await;
    redis.signal("CONT");
    assert!(r.is_problem(503, "store-unavailable"), "{r}");

    // Each take that got no answer may hold the slot until its own deadline has passed and its
    // release has run; the bound counts from the latest, and only tells "released" from "held
    // for the lease's hour" (nothing here is timed for speed).
    let mut unanswered = Instant::now();
    loop {
        let r = api.take("ghost", "k", None, None).await;
        match r.status {
            201 => {
                assert_eq!(r.n("in_use"), 1, "only this lease holds the slot: {r}");
                break;
            }
            // Denied: the slot is held, and no take was granted, so by a lease nobody was given.
            200 => {
                assert_eq!(r.body["allowed"], false, "{r}");
                assert_eq!(r.body["decided_by"], "redis", "{r}");
                assert_eq!(r.n("in_use"), 1, "the lease nobody was given: {r}");
            }
            // This take got no answer within 250 ms either (a busy machine): undone the same way.
            _ => {
                assert!(r.is_problem(503, "store-unavailable"), "{r}");
                unanswered = Instant::now();
            }
        }
        assert!(
            unanswered.elapsed() < Duration::from_secs(10),
            "the slot is still held by a lease nobody was given: {r}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_answers_carry_the_concurrency_headers() {
    let app = spawn_app(Backend::Embedded).await;
    let api = Api::new(&app, Backend::Embedded);
    app.create_policy(concurrency("heads", 5, MINUTE_MS)).await;
    let policy_header = "\"heads\";q=5;qu=\"concurrent-requests\"";

    let granted = api.granted("heads", "k", 2, MINUTE_MS).await;
    let denied = {
        api.granted("heads", "k", 3, MINUTE_MS).await;
        api.denied("heads", "k", MINUTE_MS).await
    };
    for (r, remaining) in [(&granted, 3), (&denied, 0)] {
        assert_eq!(
            r.header("ratelimit-policy").as_deref(),
            Some(policy_header),
            "{r}"
        );
        assert_eq!(
            r.header("ratelimit"),
            Some(format!("\"heads\";r={remaining}")),
            "{r}"
        );
        assert_eq!(r.n("remaining"), remaining, "{r}");
        assert_eq!(r.n("limit"), 5, "{r}");
        assert!(r.header("policy-etag").is_some(), "{r}");
    }
    // The policy's lease_ms is the default; one day is the longest a lease may be asked for.
    let r = api.take("heads", "other", None, None).await;
    api.check_granted(&r, "heads", "other", MINUTE_MS);
    assert_eq!(r.n("in_use"), 1, "cost 1 by default: {r}");
    let r = api.granted("heads", "other", 1, DAY_MS).await;
    assert!(r.n("expires_in_ms") > MINUTE_MS, "{r}");
    api.renewed(&r.lease(), Some(DAY_MS), DAY_MS).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rate_operations_and_lease_operations_each_refuse_the_other_kind_of_policy() {
    let app = spawn_app(Backend::Embedded).await;
    let api = Api::new(&app, Backend::Embedded);
    app.create_policy(concurrency("held", 5, MINUTE_MS)).await;
    app.create_policy(
        json!({"name": "rated", "algorithm": "fixed_window", "limit": 5, "window_ms": HOUR_MS}),
    )
    .await;

    for op in ["acquire", "peek", "report", "refund"] {
        let r = reply(
            app.client
                .post(app.url(&format!("/v1/{op}")))
                .json(&json!({"policy": "held", "key": "k", "cost": 1})),
        )
        .await;
        assert!(r.names_field("policy"), "{op} on a concurrency policy: {r}");
    }
    let r = api.take("rated", "k", None, None).await;
    assert!(r.names_field("policy"), "a lease on a rate policy: {r}");
    let forged = format!("l1~rated~{}~{}~1", b64url(b"k"), "0".repeat(32));
    // An id is not a call on a policy but a lease that may exist: one naming a rate policy (a
    // forged one, or its policy replaced by a rate policy since) is a lease that does not.
    let r = api.renew(&forged, None).await;
    assert!(
        r.is_problem(404, "unknown-lease"),
        "renew of a rate policy's id: {r}"
    );
    let r = api.release(&forged).await;
    assert_eq!(r.status, 204, "release of a rate policy's id: {r}");
    let r = api.take("missing", "k", None, None).await;
    assert!(r.is_problem(404, "unknown-policy"), "{r}");

    // Out of range, each named.
    for (cost, lease_ms, field) in [
        (Some(0), None, "cost"),
        (Some(6), None, "cost"),
        (None, Some(0), "lease_ms"),
        (None, Some(DAY_MS + 1), "lease_ms"),
    ] {
        let r = api.take("held", "k", cost, lease_ms).await;
        assert!(
            r.names_field(field),
            "cost {cost:?} lease_ms {lease_ms:?}: {r}"
        );
    }
    let lease = api.granted("held", "k", 1, MINUTE_MS).await.lease();
    for lease_ms in [0, DAY_MS + 1] {
        let r = api.renew(&lease, Some(lease_ms)).await;
        assert!(r.names_field("lease_ms"), "renew for {lease_ms} ms: {r}");
    }
    let r = api.renewed(&lease, None, MINUTE_MS).await;
    assert_eq!(r.n("in_use"), 1, "the refused calls took nothing: {r}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrency_policies_are_validated_and_read_back_as_written() {
    let app = spawn_app(Backend::Embedded).await;
    let valid = || concurrency("conc", 3, 1_000);
    let with = |field: &str, value: Value| {
        let mut doc = valid();
        doc[field] = value;
        doc
    };
    let without = |field: &str| {
        let mut doc = valid();
        doc.as_object_mut().expect("an object").remove(field);
        doc
    };
    let cases = [
        (with("limit", json!(0)), "limit"),
        (with("limit", json!(10_001)), "limit"),
        (without("limit"), "limit"),
        (with("lease_ms", json!(0)), "lease_ms"),
        (with("lease_ms", json!(DAY_MS + 1)), "lease_ms"),
        (without("lease_ms"), "lease_ms"),
        (with("mode", json!("shadow")), "mode"),
        (with("window_ms", json!(1_000)), "window_ms"),
        (
            json!({"name": "conc", "limits": [
                {"name": "rate", "algorithm": "fixed_window", "limit": 5, "window_ms": 1_000},
                {"name": "held", "algorithm": "concurrency", "limit": 2, "lease_ms": 1_000},
            ]}),
            "limits[1].algorithm",
        ),
    ];
    for (doc, field) in cases {
        let r = reply(app.client.post(app.url("/v1/policies")).json(&doc)).await;
        assert!(r.names_field(field), "{doc}: {r}");
    }
    assert_eq!(app.get("/v1/policies/conc").await.status(), 404);

    // The bounds themselves are accepted, and read back as written.
    let largest = json!({"name": "conc", "algorithm": "concurrency", "limit": 10_000,
        "lease_ms": DAY_MS, "fail_mode": "closed", "description": "exports at once"});
    app.create_policy(largest.clone()).await;
    let got: Value = app
        .get("/v1/policies/conc")
        .await
        .json()
        .await
        .expect("JSON");
    for field in [
        "name",
        "algorithm",
        "limit",
        "lease_ms",
        "fail_mode",
        "description",
    ] {
        assert_eq!(got[field], largest[field], "{field}: {got}");
    }
    let smallest = concurrency("conc-small", 1, 1);
    app.create_policy(smallest).await;
}
