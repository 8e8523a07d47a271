//! Envoy's rate-limit protocol over gRPC, with a tonic client built from the `envoy-types`
//! messages, against the app on the embedded store, one Redis and a Cluster: exact limits under
//! concurrency, all-or-nothing over descriptors, `hits_addend`, unmatched descriptors, one quota
//! shared with `POST /v1/acquire` (and its reservations' queues), fail modes with Redis stopped,
//! and bad calls.

use std::sync::Arc;

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::{
    Entry, RateLimitOverride,
};
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::{RateLimitRequest, RateLimitResponse};
use envoy_types::pb::google::protobuf::UInt64Value;
use serde_json::{json, Value};
use tonic::transport::Channel;

use crate::helpers::{
    masters, metric, spawn_app_on_cluster, spawn_app_with, Backend, TestApp, TestCluster, TestRedis,
};

const GRPC: (&str, &str) = ("RATELIMITER__GRPC__BIND", "127.0.0.1:0");

const EVERY_BACKEND: [Backend; 3] = [Backend::Embedded, Backend::Redis, Backend::Cluster];

async fn app(backend: Backend) -> TestApp {
    app_with(backend, &[]).await
}

async fn app_with(backend: Backend, extra: &[(&str, &str)]) -> TestApp {
    let mut settings = vec![GRPC];
    settings.extend_from_slice(extra);
    match backend {
        Backend::Embedded => spawn_app_with(None, &settings).await,
        Backend::Redis => spawn_app_with(Some(Arc::new(TestRedis::start())), &settings).await,
        Backend::Cluster => spawn_app_on_cluster(Arc::new(TestCluster::start()), &settings).await,
    }
}

async fn client(app: &TestApp) -> RateLimitServiceClient<Channel> {
    let port = app.grpc_port.expect("the app serves gRPC");
    RateLimitServiceClient::connect(format!("http://127.0.0.1:{port}"))
        .await
        .expect("gRPC connects")
}

/// A descriptor of `(key, value)` entries.
fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
    RateLimitDescriptor {
        entries: entries
            .iter()
            .map(|(k, v)| Entry {
                key: (*k).to_owned(),
                value: (*v).to_owned(),
            })
            .collect(),
        ..RateLimitDescriptor::default()
    }
}

fn request(domain: &str, descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
    RateLimitRequest {
        domain: domain.to_owned(),
        descriptors,
        hits_addend: 0,
    }
}

async fn call(
    client: &mut RateLimitServiceClient<Channel>,
    req: RateLimitRequest,
) -> RateLimitResponse {
    client
        .should_rate_limit(req)
        .await
        .expect("an answer")
        .into_inner()
}

/// One `remote_address` descriptor of domain `edge`.
fn by_address(address: &str) -> RateLimitRequest {
    request("edge", vec![descriptor(&[("remote_address", address)])])
}

fn header<'a>(r: &'a RateLimitResponse, name: &str) -> Option<&'a str> {
    r.response_headers_to_add
        .iter()
        .find(|h| h.key.eq_ignore_ascii_case(name))
        .map(|h| h.value.as_str())
}

/// `limit` per address an hour, as a token bucket: no window edge for a test to cross, and
/// answers exact to the microsecond.
fn per_address(limit: u64) -> Value {
    json!({
        "name": "per-address", "algorithm": "token_bucket",
        "capacity": limit, "refill_tokens": limit, "refill_period_ms": 3_600_000,
        "descriptor": {"domain": "edge", "entries": [{"key": "remote_address"}]}
    })
}

/// Exactly `limit` of 200 concurrent calls for one address are `OK`.
async fn limits_per_address_exactly(backend: Backend) {
    let app = app(backend).await;
    app.create_policy(per_address(50)).await;
    let client = client(&app).await;
    let calls = (0..200).map(|_| {
        let mut c = client.clone();
        tokio::spawn(async move { call(&mut c, by_address("10.0.0.1")).await })
    });
    let mut ok = 0;
    for answer in futures_util::future::join_all(calls).await {
        let r = answer.expect("the call ran");
        assert_eq!(r.statuses.len(), 1);
        assert_eq!(r.statuses[0].code, r.overall_code);
        if r.overall_code == Code::Ok as i32 {
            ok += 1;
        } else {
            assert_eq!(r.overall_code, Code::OverLimit as i32);
            assert!(header(&r, "retry-after").is_some(), "{r:?}");
        }
    }
    assert_eq!(ok, 50, "{backend:?}: exactly the limit");
    // Another address has its own quota.
    let r = call(&mut client.clone(), by_address("10.0.0.2")).await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses[0].limit_remaining, 49);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_per_address_exactly_on_the_embedded_store() {
    limits_per_address_exactly(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_per_address_exactly_on_redis() {
    limits_per_address_exactly(Backend::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limits_per_address_exactly_on_a_cluster() {
    limits_per_address_exactly(Backend::Cluster).await;
}

/// Two policies of domain `edge`: `per-user` (limit 5) on `user`, and `per-path` (limit 2) on
/// `path`.
async fn two_policies(app: &TestApp) {
    app.create_policy(json!({
        "name": "per-user", "algorithm": "token_bucket", "capacity": 5,
        "refill_tokens": 1, "refill_period_ms": 60_000,
        "descriptor": {"domain": "edge", "entries": [{"key": "user"}]}
    }))
    .await;
    app.create_policy(json!({
        "name": "per-path", "algorithm": "sliding_window_counter", "limit": 2, "window_ms": 60_000,
        "descriptor": {"domain": "edge", "entries": [{"key": "path"}]}
    }))
    .await;
}

fn user_and_path() -> RateLimitRequest {
    request(
        "edge",
        vec![
            descriptor(&[("user", "alice")]),
            descriptor(&[("path", "/a")]),
        ],
    )
}

/// A denial of the second descriptor takes nothing from the first.
async fn a_denial_takes_nothing_from_the_others(backend: Backend) {
    let app = app(backend).await;
    two_policies(&app).await;
    let mut client = client(&app).await;
    for left in [4, 3] {
        let r = call(&mut client, user_and_path()).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{r:?}");
        assert_eq!(r.statuses[0].limit_remaining, left);
        assert_eq!(r.statuses[1].limit_remaining, left - 3);
    }
    // `per-path` is spent: the call is over its limit, and `per-user` keeps its 3.
    for _ in 0..3 {
        let r = call(&mut client, user_and_path()).await;
        assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
        assert_eq!(r.statuses[0].code, Code::Ok as i32, "the first admits");
        assert_eq!(r.statuses[1].code, Code::OverLimit as i32);
        assert_eq!(
            r.statuses[0].limit_remaining, 3,
            "nothing taken from the first"
        );
        let limit = r.statuses[1].current_limit.as_ref().expect("a limit");
        assert_eq!(
            (limit.name.as_str(), limit.requests_per_unit),
            ("per-path", 2)
        );
        let retry: u64 = header(&r, "retry-after")
            .and_then(|v| v.parse().ok())
            .expect("Retry-After");
        // A sliding window counter frees its units over up to two windows.
        assert!((1..=120).contains(&retry), "{retry}");
    }
    let alone = app.acquire("per-user", "alice", 1).await;
    assert_eq!(
        alone["remaining"], 2,
        "per-user lost nothing to the denials"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_takes_nothing_from_the_others_on_the_embedded_store() {
    a_denial_takes_nothing_from_the_others(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_takes_nothing_from_the_others_on_redis() {
    a_denial_takes_nothing_from_the_others(Backend::Redis).await;
}

/// On a Cluster the descriptors are decided in turn and what the first took is refunded: after
/// the answer, nothing stays taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_takes_nothing_from_the_others_on_a_cluster_once_refunded() {
    a_denial_takes_nothing_from_the_others(Backend::Cluster).await;
}

/// Under concurrency, all or nothing holds exactly: 40 calls, each of both descriptors, against
/// `per-user` (5) and `per-path` (2): exactly 2 allowed, and `per-user` keeps 3.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn all_or_nothing_holds_under_concurrency_on_redis() {
    let app = app(Backend::Redis).await;
    two_policies(&app).await;
    let client = client(&app).await;
    let calls = (0..40).map(|_| {
        let mut c = client.clone();
        tokio::spawn(async move { call(&mut c, user_and_path()).await })
    });
    let ok = futures_util::future::join_all(calls)
        .await
        .into_iter()
        .filter(|r| r.as_ref().is_ok_and(|r| r.overall_code == Code::Ok as i32))
        .count();
    assert_eq!(ok, 2);
    assert_eq!(app.acquire("per-user", "alice", 1).await["remaining"], 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_addend_is_the_cost_per_request_and_per_descriptor() {
    for backend in EVERY_BACKEND {
        hits_addend_is_the_cost(backend).await;
    }
}

async fn hits_addend_is_the_cost(backend: Backend) {
    // Negative hits are refunds without a ticket: allowed only by this setting.
    let app = app_with(
        backend,
        &[("RATELIMITER__LIMITS__TICKETLESS_REFUNDS", "true")],
    )
    .await;
    app.create_policy(per_address(10)).await;
    let mut client = client(&app).await;
    let mut req = by_address("a");
    req.hits_addend = 4;
    let r = call(&mut client, req.clone()).await;
    assert_eq!(r.statuses[0].limit_remaining, 6);
    // The descriptor's own overrides the request's.
    req.descriptors[0].hits_addend = Some(UInt64Value { value: 5 });
    let r = call(&mut client, req.clone()).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 1)
    );
    req.descriptors[0].hits_addend = Some(UInt64Value { value: 2 });
    let r = call(&mut client, req.clone()).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "2 > 1 left");
    assert_eq!(r.statuses[0].limit_remaining, 1, "a denial takes nothing");
    // 0 takes nothing and answers whether 1 unit would fit.
    req.descriptors[0].hits_addend = Some(UInt64Value { value: 0 });
    let r = call(&mut client, req.clone()).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 1)
    );
    // Negative hits give units back.
    req.descriptors[0].hits_addend = Some(UInt64Value { value: 3 });
    req.descriptors[0].is_negative_hits = true;
    let r = call(&mut client, req.clone()).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::Ok as i32, 4)
    );
    // Above the limit's quota: never allowed, and nothing asked of the store.
    req.descriptors[0].is_negative_hits = false;
    req.descriptors[0].hits_addend = Some(UInt64Value { value: 11 });
    let r = call(&mut client, req).await;
    assert_eq!(
        (r.overall_code, r.statuses[0].limit_remaining),
        (Code::OverLimit as i32, 4)
    );
    assert_eq!(header(&r, "Retry-After"), None, "no wait lets it through");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_hits_are_refused_by_default_and_change_nothing() {
    let app = app(Backend::Embedded).await;
    app.create_policy(per_address(10)).await;
    let mut client = client(&app).await;
    let mut req = by_address("a");
    req.hits_addend = 4;
    assert_eq!(
        call(&mut client, req.clone()).await.statuses[0].limit_remaining,
        6
    );
    // Refused before anything is decided: no units come back.
    let mut refund = req.clone();
    refund.descriptors[0].is_negative_hits = true;
    let status = client
        .should_rate_limit(refund)
        .await
        .expect_err("refused without limits.ticketless_refunds");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(
        status.message().contains("ticketless_refunds"),
        "{status:?}"
    );
    assert_eq!(app.acquire("per-address", "a", 1).await["remaining"], 5);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unmatched_descriptors_are_ok_and_the_most_specific_policy_serves() {
    for backend in EVERY_BACKEND {
        unmatched_and_most_specific(backend).await;
    }
}

async fn unmatched_and_most_specific(backend: Backend) {
    let app = app(backend).await;
    app.create_policy(json!({
        "name": "any-path", "algorithm": "token_bucket",
        "capacity": 100, "refill_tokens": 100, "refill_period_ms": 3_600_000,
        "descriptor": {"domain": "edge", "entries": [{"key": "path"}, {"key": "remote_address"}]}
    }))
    .await;
    app.create_policy(json!({
        "name": "login", "algorithm": "fixed_window", "limit": 3, "window_ms": 60_000,
        "descriptor": {"domain": "edge", "entries": [
            {"key": "path", "value": "/login"}, {"key": "remote_address"}]}
    }))
    .await;
    let mut client = client(&app).await;
    let r = call(
        &mut client,
        request(
            "edge",
            vec![
                descriptor(&[("path", "/login"), ("remote_address", "1.2.3.4")]),
                descriptor(&[("path", "/home"), ("remote_address", "1.2.3.4")]),
                descriptor(&[("remote_address", "1.2.3.4")]),
                descriptor(&[("path", "/login")]),
            ],
        ),
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert_eq!(r.statuses.len(), 4);
    let limit = |i: usize| {
        r.statuses[i]
            .current_limit
            .as_ref()
            .map(|l| (l.name.clone(), l.unit))
    };
    assert_eq!(
        limit(0),
        Some(("login".to_owned(), 2)),
        "fixed value wins; MINUTE"
    );
    assert_eq!(limit(1), Some(("any-path".to_owned(), 3)), "HOUR");
    assert_eq!(
        (limit(2), limit(3)),
        (None, None),
        "no policy serves these: OK"
    );
    assert_eq!(r.statuses[0].limit_remaining, 2);
    // Another domain matches nothing.
    let r = call(
        &mut client,
        request("other", vec![descriptor(&[("remote_address", "1.2.3.4")])]),
    )
    .await;
    assert_eq!(r.overall_code, Code::Ok as i32);
    assert!(r.statuses[0].current_limit.is_none());
    // The subject of several variable entries: their values joined by `|`.
    let shared = app.acquire("any-path", "/home|1.2.3.4", 1).await;
    assert_eq!(shared["remaining"], 98, "the gRPC call took 1 already");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_and_the_http_api_share_one_quota() {
    for backend in EVERY_BACKEND {
        let app = app(backend).await;
        app.create_policy(per_address(6)).await;
        let mut client = client(&app).await;
        let mut answers = Vec::new();
        for i in 0..8 {
            if i % 2 == 0 {
                let r = call(&mut client, by_address("10.9.9.9")).await;
                answers.push((
                    r.overall_code == Code::Ok as i32,
                    u64::from(r.statuses[0].limit_remaining),
                ));
            } else {
                let a = app.acquire("per-address", "10.9.9.9", 1).await;
                answers.push((a["allowed"] == true, a["remaining"].as_u64().unwrap_or(99)));
            }
        }
        let expected: Vec<(bool, u64)> = (0..8u64)
            .map(|i| (i < 6, 6u64.saturating_sub(i + 1)))
            .collect();
        assert_eq!(answers, expected, "{backend:?}: one quota, decided alike");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_carry_the_ratelimit_fields_for_envoy_to_add() {
    let app = app(Backend::Embedded).await;
    // A name no other test uses: the metrics recorder is the process's.
    let mut policy = per_address(2);
    policy["name"] = json!("fields");
    app.create_policy(policy).await;
    let mut client = client(&app).await;
    let r = call(&mut client, by_address("h")).await;
    assert_eq!(
        header(&r, "RateLimit-Policy"),
        Some("\"fields\";q=2;w=3600")
    );
    // One of 2 tokens gone: back in half an hour.
    assert_eq!(header(&r, "RateLimit"), Some("\"fields\";r=1;t=1800"));
    assert_eq!(header(&r, "Retry-After"), None);
    let until = r.statuses[0]
        .duration_until_reset
        .as_ref()
        .expect("a reset");
    assert_eq!((until.seconds, until.nanos), (1_800, 0));
    call(&mut client, by_address("h")).await;
    let r = call(&mut client, by_address("h")).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32);
    assert_eq!(header(&r, "RateLimit"), Some("\"fields\";r=0;t=3600"));
    assert_eq!(header(&r, "Retry-After"), Some("1800"));
    let counted = |code: &'static str| {
        let app = &app;
        async move {
            let labels = [("policy", "fields"), ("code", code)];
            metric(app, "ratelimiter_grpc_descriptors_total", &labels).await
        }
    };
    assert_eq!(
        (counted("ok").await, counted("over_limit").await),
        (2.0, 1.0)
    );
    let decided = [("policy", "fields"), ("outcome", "denied")];
    assert_eq!(
        metric(&app, "ratelimiter_decisions_total", &decided).await,
        1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_calls_are_invalid_arguments() {
    let app = app(Backend::Embedded).await;
    app.create_policy(per_address(2)).await;
    let mut client = client(&app).await;
    // The recorder is the process's: only this test makes invalid calls.
    let invalid = [("code", "invalid_argument")];
    let before = metric(&app, "ratelimiter_grpc_requests_total", &invalid).await;
    let cases = [
        (
            request("", vec![descriptor(&[("remote_address", "a")])]),
            "domain",
        ),
        (request("edge", vec![]), "descriptors"),
        (request("edge", vec![descriptor(&[])]), "descriptors[0]"),
        (
            request(
                "edge",
                vec![
                    descriptor(&[("x", "1")]),
                    descriptor(&[("remote_address", "")]),
                ],
            ),
            "descriptors[1]",
        ),
    ];
    for (req, names) in cases {
        let status = client.should_rate_limit(req).await.expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(status.message().contains(names), "{status:?}");
    }
    let after = metric(&app, "ratelimiter_grpc_requests_total", &invalid).await;
    assert_eq!(after - before, 4.0, "each refused call counted");
    // Nothing was taken by the refused calls.
    let r = call(&mut client, by_address("a")).await;
    assert_eq!(r.statuses[0].limit_remaining, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_tokens_guard_grpc_calls_too() {
    let app = app_with(
        Backend::Embedded,
        &[("RATELIMITER__AUTH__CLIENT_TOKENS", "s3cret")],
    )
    .await;
    let mut client = client(&app).await;
    let status = client
        .should_rate_limit(by_address("a"))
        .await
        .expect_err("no token");
    assert_eq!(status.code(), tonic::Code::Unauthenticated);
    let mut req = tonic::Request::new(by_address("a"));
    req.metadata_mut()
        .insert("authorization", "Bearer s3cret".parse().expect("ascii"));
    let r = client.should_rate_limit(req).await.expect("with the token");
    assert_eq!(r.into_inner().overall_code, Code::Ok as i32);
}

/// With `auth.settle_tokens` set, negative hits (refunds without a ticket) need a settle token:
/// a front end's client token may decide but not give units back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_hits_need_a_settle_token_when_settle_tokens_are_set() {
    let app = app_with(
        Backend::Embedded,
        &[
            ("RATELIMITER__AUTH__CLIENT_TOKENS", "front"),
            ("RATELIMITER__AUTH__SETTLE_TOKENS", "back"),
            ("RATELIMITER__LIMITS__TICKETLESS_REFUNDS", "true"),
        ],
    )
    .await;
    app.create_policy(per_address(5)).await;
    let mut client = client(&app).await;
    let with = |token: &str, negative: bool| {
        let mut body = by_address("n");
        body.descriptors[0].is_negative_hits = negative;
        let mut req = tonic::Request::new(body);
        req.metadata_mut().insert(
            "authorization",
            format!("Bearer {token}").parse().expect("ascii"),
        );
        req
    };
    let taken = client.should_rate_limit(with("front", false)).await;
    assert_eq!(
        taken.expect("decided").into_inner().overall_code,
        Code::Ok as i32
    );
    let status = client
        .should_rate_limit(with("front", true))
        .await
        .expect_err("a client token may not settle");
    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{status:?}");
    let before: Value = app
        .client
        .post(app.url("/v1/peek"))
        .bearer_auth("front")
        .json(&json!({"policy": "per-address", "key": "n"}))
        .send()
        .await
        .expect("sent")
        .json()
        .await
        .expect("JSON");
    assert_eq!(before["remaining"], 4, "nothing was given back: {before}");
    let given = client.should_rate_limit(with("back", true)).await;
    assert_eq!(
        given.expect("settled").into_inner().overall_code,
        Code::Ok as i32
    );
}

/// An app on a private Redis whose calls time out after 200 ms, with a policy of 2 a minute for
/// each fail mode of `modes`, named `<prefix><mode>` and serving descriptors `edge` / `<mode>`.
async fn app_with_fail_modes(prefix: &str, modes: &[&str]) -> (Arc<TestRedis>, TestApp) {
    let redis = Arc::new(TestRedis::start());
    let app = spawn_app_with(
        Some(redis.clone()),
        &[GRPC, ("RATELIMITER__REDIS__TIMEOUT_MS", "200")],
    )
    .await;
    for mode in modes {
        app.create_policy(json!({
            "name": format!("{prefix}{mode}"), "algorithm": "fixed_window", "limit": 2,
            "window_ms": 60_000, "fail_mode": mode,
            "descriptor": {"domain": "edge", "entries": [{"key": mode}]}
        }))
        .await;
    }
    (redis, app)
}

/// With Redis stopped: `closed` is `UNAVAILABLE`, `open` is `OK` marked `fail_open`, `local`
/// decides in this instance, marked `fail_local`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fail_modes_answer_when_redis_is_stopped() {
    let (redis, app) = app_with_fail_modes("", &["open", "closed", "local"]).await;
    let mut client = client(&app).await;
    let one = |mode: &str| request("edge", vec![descriptor(&[(mode, "k")])]);
    assert_eq!(
        call(&mut client, one("open")).await.overall_code,
        Code::Ok as i32
    );
    let stopping = redis.clone();
    tokio::task::spawn_blocking(move || stopping.stop())
        .await
        .expect("stop");

    let status = client
        .should_rate_limit(one("closed"))
        .await
        .expect_err("closed");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    for _ in 0..3 {
        let r = call(&mut client, one("open")).await;
        assert_eq!(r.overall_code, Code::Ok as i32);
        assert_eq!(header(&r, "Decided-By"), Some("fail_open"));
        assert_eq!(header(&r, "RateLimit"), None, "nothing was counted");
    }
    let local: Vec<i32> = {
        let mut codes = Vec::new();
        for _ in 0..3 {
            let r = call(&mut client, one("local")).await;
            assert_eq!(header(&r, "Decided-By"), Some("fail_local"));
            codes.push(r.overall_code);
        }
        codes
    };
    assert_eq!(
        local,
        [Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32]
    );
    // Descriptors of `open` and `closed` together: the closed one fails the call.
    let both = request(
        "edge",
        vec![descriptor(&[("open", "k")]), descriptor(&[("closed", "k")])],
    );
    let status = client
        .should_rate_limit(both)
        .await
        .expect_err("closed wins");
    assert_eq!(status.code(), tonic::Code::Unavailable);
}

/// With Redis stopped, descriptors of an `open` and a `local` policy in one request: each is
/// answered by its own fail mode, as it would be alone (and as on a Cluster, where they are
/// decided one after the other), so the `local` policy's limit still holds in this instance; the
/// request, all or nothing, is denied with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_limit_holds_beside_an_open_one_when_redis_is_stopped() {
    // Names of their own: the metrics registry is the test process's.
    let (redis, app) = app_with_fail_modes("beside-", &["open", "local"]).await;
    let mut client = client(&app).await;
    let both = || {
        request(
            "edge",
            vec![descriptor(&[("open", "k")]), descriptor(&[("local", "k")])],
        )
    };
    assert_eq!(
        call(&mut client, both()).await.overall_code,
        Code::Ok as i32
    );
    let stopping = redis.clone();
    tokio::task::spawn_blocking(move || stopping.stop())
        .await
        .expect("stop");
    let mut codes = Vec::new();
    for _ in 0..3 {
        let r = call(&mut client, both()).await;
        assert_eq!(r.statuses.len(), 2, "{r:?}");
        codes.push(r.overall_code);
    }
    assert_eq!(
        codes,
        [Code::Ok as i32, Code::Ok as i32, Code::OverLimit as i32],
        "the local limit of 2 holds in this instance"
    );
    let degraded = [("outcome", "degraded"), ("policy", "beside-local")];
    assert_eq!(
        metric(&app, "ratelimiter_decisions_total", &degraded).await,
        3.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn descriptors_are_validated_and_unique_per_shape() {
    let app = app(Backend::Embedded).await;
    app.create_policy(per_address(2)).await;
    let clash = app
        .post(
            "/v1/policies",
            &json!({
                "name": "again", "algorithm": "fixed_window", "limit": 1, "window_ms": 1_000,
                "descriptor": {"domain": "edge", "entries": [{"key": "remote_address"}]}
            }),
        )
        .await;
    assert_eq!(clash.status(), 409);
    let body: Value = clash.json().await.expect("problem");
    assert_eq!(body["field"], "descriptor", "{body}");
    // Another domain, or a fixed value, is another shape.
    for descriptor in [
        json!({"domain": "other", "entries": [{"key": "remote_address"}]}),
        json!({"domain": "edge", "entries": [{"key": "remote_address", "value": "10.0.0.1"}]}),
    ] {
        let name = format!("p{}", descriptor.to_string().len());
        app.create_policy(json!({
            "name": name, "algorithm": "fixed_window", "limit": 1, "window_ms": 1_000,
            "descriptor": descriptor
        }))
        .await;
    }
    // A policy may keep its own shape when replaced.
    let put = app.put("/v1/policies/per-address", &per_address(3)).await;
    assert_eq!(put.status(), 200);
    let read: Value = app
        .get("/v1/policies/per-address")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(read["descriptor"], per_address(3)["descriptor"]);
    for (doc, field) in [
        (
            json!({"domain": "edge", "entries": []}),
            "descriptor.entries",
        ),
        (json!({"entries": [{"key": "a"}]}), "descriptor.domain"),
        (
            json!({"domain": "edge", "entries": [{"key": "a", "valu": "x"}]}),
            "descriptor.entries[0].valu",
        ),
    ] {
        let r = app
            .post(
                "/v1/policies",
                &json!({"name": "bad", "algorithm": "fixed_window", "limit": 1, "window_ms": 1_000, "descriptor": doc}),
            )
            .await;
        assert!(matches!(r.status().as_u16(), 400 | 422), "{doc}");
        let body: Value = r.json().await.expect("problem");
        assert_eq!(body["field"], field, "{body}");
    }
    let r = app
        .post(
            "/v1/policies",
            &json!({"name": "c", "algorithm": "concurrency", "limit": 1, "lease_ms": 1_000,
                    "descriptor": {"domain": "edge", "entries": [{"key": "x"}]}}),
        )
        .await;
    assert_eq!(r.status(), 422);
}

/// Creates an override of `policy` over HTTP; answers its id.
async fn create_override(app: &TestApp, policy: &str, body: Value) -> String {
    let doc = app.create_override(policy, body).await;
    doc["id"].as_str().expect("an id").to_owned()
}

/// `n` calls of one `remote_address` descriptor; answers how many were `OK`, and the last answer.
async fn oks_of(
    client: &mut RateLimitServiceClient<Channel>,
    address: &str,
    n: usize,
) -> (usize, RateLimitResponse) {
    let mut ok = 0;
    let mut last = RateLimitResponse::default();
    for _ in 0..n {
        last = call(client, by_address(address)).await;
        if last.overall_code == Code::Ok as i32 {
            ok += 1;
        }
    }
    (ok, last)
}

/// The descriptor's limit as the answer gives it: `(requests_per_unit, unit)`.
fn current(r: &RateLimitResponse, i: usize) -> Option<(u32, i32)> {
    let l = r.statuses.get(i)?.current_limit.as_ref()?;
    Some((l.requests_per_unit, l.unit))
}

/// Overrides written over HTTP apply to the subject key a descriptor makes (the value of its one
/// variable entry): by exact key and by prefix, with their quota in `current_limit` and the
/// override named in `Ratelimit-Override`; `block` denies and `unlimited` allows, both without
/// asking the store; every other address keeps the policy's limit.
async fn overrides_apply_to_descriptor_subjects(backend: Backend) {
    let app = app(backend).await;
    app.create_policy(per_address(2)).await;
    let hourly = |n: u64| json!({"per-address": {"capacity": n, "refill_tokens": n}});
    let vip = create_override(
        &app,
        "per-address",
        json!({"match": {"key": "10.0.0.9"}, "limits": hourly(5)}),
    )
    .await;
    let acme = create_override(
        &app,
        "per-address",
        json!({"match": {"prefix": "10.7."}, "limits": hourly(3)}),
    )
    .await;
    let blocked = create_override(
        &app,
        "per-address",
        json!({"match": {"key": "10.6.6.6"}, "block": true}),
    )
    .await;
    let health = create_override(
        &app,
        "per-address",
        json!({"match": {"key": "10.0.0.1"}, "unlimited": true}),
    )
    .await;
    let mut client = client(&app).await;
    const HOUR: i32 = 3;

    let (ok, last) = oks_of(&mut client, "10.0.0.9", 7).await;
    assert_eq!(ok, 5, "{backend:?}: the exact override's 5: {last:?}");
    assert_eq!(current(&last, 0), Some((5, HOUR)), "{last:?}");
    assert_eq!(
        header(&last, "Ratelimit-Override"),
        Some(format!("id={vip};match=exact").as_str())
    );
    assert_eq!(
        header(&last, "RateLimit-Policy"),
        Some("\"per-address\";q=5;w=3600")
    );

    let (ok, last) = oks_of(&mut client, "10.7.1.2", 5).await;
    assert_eq!(ok, 3, "{backend:?}: the prefix's 3: {last:?}");
    assert_eq!(current(&last, 0), Some((3, HOUR)));
    assert_eq!(
        header(&last, "Ratelimit-Override"),
        Some(format!("id={acme};match=prefix").as_str())
    );

    let (ok, last) = oks_of(&mut client, "10.6.6.6", 2).await;
    assert_eq!(ok, 0, "{backend:?}: blocked: {last:?}");
    assert_eq!(last.statuses[0].code, Code::OverLimit as i32);
    assert_eq!(last.statuses[0].limit_remaining, 0);
    assert_eq!(
        header(&last, "Ratelimit-Override"),
        Some(format!("id={blocked};match=exact").as_str())
    );
    assert_eq!(header(&last, "Retry-After"), None, "a block without expiry");

    let (ok, last) = oks_of(&mut client, "10.0.0.1", 20).await;
    assert_eq!(ok, 20, "{backend:?}: unlimited: {last:?}");
    assert_eq!(
        header(&last, "Ratelimit-Override"),
        Some(format!("id={health};match=exact").as_str())
    );
    // A cost above every quota is allowed too: no limit is consulted.
    let mut big = by_address("10.0.0.1");
    big.hits_addend = 1_000;
    assert_eq!(call(&mut client, big).await.overall_code, Code::Ok as i32);

    let (ok, last) = oks_of(&mut client, "10.0.0.2", 3).await;
    assert_eq!(ok, 2, "{backend:?}: the policy's own: {last:?}");
    assert_eq!(current(&last, 0), Some((2, HOUR)));
    assert_eq!(header(&last, "Ratelimit-Override"), None);

    // Neither the blocked nor the unlimited subject reached the store.
    if let Some(masters) = masters(&app) {
        for mut conn in masters {
            for pattern in ["*10.6.6.6*", "*10.0.0.1*"] {
                let keys: Vec<String> = ::redis::cmd("KEYS")
                    .arg(pattern)
                    .query(&mut conn)
                    .expect("KEYS");
                assert!(keys.is_empty(), "the store was consulted: {keys:?}");
            }
        }
    }
    // The HTTP API decides the same subject under the same override.
    let d = app.acquire("per-address", "10.7.1.2", 1).await;
    assert_eq!(d["allowed"], false, "the prefix's 3 are spent: {d}");
    assert_eq!(d["override"]["id"], json!(acme));

    // A blocked descriptor beside another denies the call, and the other keeps its units.
    let both = request(
        "edge",
        vec![
            descriptor(&[("remote_address", "10.0.0.3")]),
            descriptor(&[("remote_address", "10.6.6.6")]),
        ],
    );
    let r = call(&mut client, both).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{r:?}");
    assert_eq!(
        (r.statuses[0].code, r.statuses[1].code),
        (Code::Ok as i32, Code::OverLimit as i32)
    );
    let alone = call(&mut client, by_address("10.0.0.3")).await;
    assert_eq!(
        alone.statuses[0].limit_remaining, 1,
        "nothing was taken by the denied call: {alone:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_apply_to_descriptor_subjects_on_the_embedded_store() {
    overrides_apply_to_descriptor_subjects(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_apply_to_descriptor_subjects_on_redis() {
    overrides_apply_to_descriptor_subjects(Backend::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overrides_apply_to_descriptor_subjects_on_a_cluster() {
    overrides_apply_to_descriptor_subjects(Backend::Cluster).await;
}

/// One descriptor `key = value` of domain `edge`, giving its own limit of `rpu` per `unit`
/// (`envoy.type.v3.RateLimitUnit`: 1 SECOND, 2 MINUTE, 3 HOUR, 6 YEAR).
fn with_limit(key: &str, value: &str, rpu: u32, unit: i32) -> RateLimitRequest {
    let mut d = descriptor(&[(key, value)]);
    d.limit = Some(RateLimitOverride {
        requests_per_unit: rpu,
        unit,
    });
    request("edge", vec![d])
}

/// `n` calls of `req`; answers how many were `OK`, and the last answer.
async fn oks_of_request(
    client: &mut RateLimitServiceClient<Channel>,
    req: &RateLimitRequest,
    n: usize,
) -> (usize, RateLimitResponse) {
    let mut ok = 0;
    let mut last = RateLimitResponse::default();
    for _ in 0..n {
        last = call(client, req.clone()).await;
        if last.overall_code == Code::Ok as i32 {
            ok += 1;
        }
    }
    (ok, last)
}

/// A descriptor's `limit` is ignored by a policy without `request_limits`; with it, honoured
/// within the maximum (5 a minute here), clamped in rate and in quota above it, and passed over
/// where an override applies to the subject.
async fn request_limits_are_ignored_honoured_or_clamped(backend: Backend) {
    const SECOND: i32 = 1;
    const MINUTE: i32 = 2;
    const HOUR: i32 = 3;
    const YEAR: i32 = 6;
    let app = app(backend).await;
    app.create_policy(json!({
        "name": "plain", "algorithm": "fixed_window", "limit": 2, "window_ms": 3_600_000,
        "descriptor": {"domain": "edge", "entries": [{"key": "plain"}]}
    }))
    .await;
    app.create_policy(json!({
        "name": "asked", "algorithm": "token_bucket",
        "capacity": 2, "refill_tokens": 2, "refill_period_ms": 3_600_000,
        "descriptor": {"domain": "edge", "entries": [{"key": "client"}]},
        "request_limits": {"max_requests_per_unit": 5, "unit": "minute"}
    }))
    .await;
    let read: Value = app
        .get("/v1/policies/asked")
        .await
        .json()
        .await
        .expect("JSON");
    assert_eq!(
        read["request_limits"],
        json!({"max_requests_per_unit": 5, "unit": "minute"})
    );
    let vip = create_override(
        &app,
        "asked",
        json!({"match": {"key": "vip"}, "limits": {"asked": {"capacity": 4, "refill_tokens": 4}}}),
    )
    .await;
    let mut client = client(&app).await;

    // Without `request_limits`: ignored, whatever it is (even a unit no limit can have).
    for (value, unit) in [("a", MINUTE), ("b", YEAR)] {
        let (ok, last) =
            oks_of_request(&mut client, &with_limit("plain", value, 10, unit), 4).await;
        assert_eq!(ok, 2, "{backend:?}: the policy's own: {last:?}");
        assert_eq!(current(&last, 0), Some((2, HOUR)));
    }

    // Within the maximum: as asked.
    let (ok, last) = oks_of_request(&mut client, &with_limit("client", "c1", 3, MINUTE), 5).await;
    assert_eq!(ok, 3, "{backend:?}: 3 a minute, as asked: {last:?}");
    assert_eq!(current(&last, 0), Some((3, MINUTE)));
    assert_eq!(
        header(&last, "RateLimit-Policy"),
        Some("\"asked\";q=3;w=60")
    );
    assert_eq!(header(&last, "Ratelimit-Override"), None);

    // Above it: 50 a minute is 5 a minute; 100 an hour is a slower rate but 100 at once, so 5
    // an hour; 1 a second is faster, and no whole second fits 5 a minute: 5 a minute.
    for (value, rpu, unit, expected) in [
        ("c2", 50, MINUTE, (5, MINUTE)),
        ("c3", 100, HOUR, (5, HOUR)),
        ("c4", 1, SECOND, (5, MINUTE)),
    ] {
        let (ok, last) =
            oks_of_request(&mut client, &with_limit("client", value, rpu, unit), 7).await;
        assert_eq!(ok, 5, "{backend:?}: {rpu} per {unit} clamped: {last:?}");
        assert_eq!(current(&last, 0), Some(expected), "{rpu} per {unit}");
    }

    // No limit given: the policy's own.
    let plain = request("edge", vec![descriptor(&[("client", "c5")])]);
    let (ok, last) = oks_of_request(&mut client, &plain, 4).await;
    assert_eq!(ok, 2, "{backend:?}: the policy's own: {last:?}");
    assert_eq!(current(&last, 0), Some((2, HOUR)));

    // An override of the subject wins over the request's limit.
    let (ok, last) = oks_of_request(&mut client, &with_limit("client", "vip", 3, MINUTE), 6).await;
    assert_eq!(ok, 4, "{backend:?}: the override's 4: {last:?}");
    assert_eq!(current(&last, 0), Some((4, HOUR)));
    assert_eq!(
        header(&last, "Ratelimit-Override"),
        Some(format!("id={vip};match=exact").as_str())
    );

    // A limit the policy would take but that no limit can be: refused, nothing decided.
    for (rpu, unit, names) in [
        (0, MINUTE, "requests_per_unit"),
        (5, YEAR, "YEAR"),
        (5, 99, "unit"),
    ] {
        let status = client
            .should_rate_limit(with_limit("client", "c6", rpu, unit))
            .await
            .expect_err("refused");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        assert!(
            status.message().contains(names) && status.message().contains("descriptors[0]"),
            "{status:?}"
        );
    }
    let r = call(&mut client, with_limit("client", "c6", 5, MINUTE)).await;
    assert_eq!(
        r.statuses[0].limit_remaining, 4,
        "nothing taken by the refusals"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_limits_are_ignored_honoured_or_clamped_on_the_embedded_store() {
    request_limits_are_ignored_honoured_or_clamped(Backend::Embedded).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_limits_are_ignored_honoured_or_clamped_on_redis() {
    request_limits_are_ignored_honoured_or_clamped(Backend::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_limits_are_ignored_honoured_or_clamped_on_a_cluster() {
    request_limits_are_ignored_honoured_or_clamped(Backend::Cluster).await;
}

/// Two descriptors of one call, both giving their own limit, decided together: all or nothing
/// holds with the limits they gave (on a Cluster, in turn, with what was taken refunded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_limits_hold_all_or_nothing_over_descriptors_on_redis() {
    request_limits_hold_all_or_nothing(Backend::Redis).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_limits_hold_all_or_nothing_over_descriptors_on_a_cluster() {
    request_limits_hold_all_or_nothing(Backend::Cluster).await;
}

async fn request_limits_hold_all_or_nothing(backend: Backend) {
    let app = app(backend).await;
    for (name, key) in [("joint-a", "ja"), ("joint-b", "jb")] {
        app.create_policy(json!({
            "name": name, "algorithm": "fixed_window", "limit": 1, "window_ms": 3_600_000,
            "descriptor": {"domain": "edge", "entries": [{"key": key}]},
            "request_limits": {"max_requests_per_unit": 100, "unit": "hour"}
        }))
        .await;
    }
    let mut client = client(&app).await;
    let both = |a: u32, b: u32| {
        let mut req = with_limit("ja", "s", a, 3);
        req.descriptors
            .extend(with_limit("jb", "s", b, 3).descriptors);
        req
    };
    let (ok, last) = oks_of_request(&mut client, &both(5, 3), 5).await;
    assert_eq!(
        ok, 3,
        "{backend:?}: the tighter of the two given limits: {last:?}"
    );
    assert_eq!(
        (current(&last, 0), current(&last, 1)),
        (Some((5, 3)), Some((3, 3)))
    );
    assert_eq!(
        last.statuses[0].limit_remaining, 2,
        "nothing taken by the denials"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_request_limits_are_refused_naming_the_member() {
    let app = app(Backend::Embedded).await;
    let fw = json!({"name": "rl", "algorithm": "fixed_window", "limit": 1, "window_ms": 1_000});
    let with = |rl: Value| {
        let mut p = fw.clone();
        p["request_limits"] = rl;
        p
    };
    for (doc, field, status) in [
        (
            with(json!({"max_requests_per_unit": 0, "unit": "minute"})),
            "request_limits.max_requests_per_unit",
            422,
        ),
        (
            with(json!({"max_requests_per_unit": 1_000_000_001_u64, "unit": "minute"})),
            "request_limits.max_requests_per_unit",
            422,
        ),
        (
            with(json!({"unit": "minute"})),
            "request_limits.max_requests_per_unit",
            422,
        ),
        (
            with(json!({"max_requests_per_unit": 5, "unit": "fortnight"})),
            "request_limits.unit",
            422,
        ),
        (
            with(json!({"max_requests_per_unit": 5, "unit": "minute", "burst": 2})),
            "request_limits.burst",
            422,
        ),
        (
            with(json!({"max_requests_per_unit": "5", "unit": "minute"})),
            "request_limits.max_requests_per_unit",
            400,
        ),
        (
            json!({"name": "rl", "algorithm": "sliding_window_log", "limit": 1, "window_ms": 1_000,
                   "request_limits": {"max_requests_per_unit": 10_001, "unit": "minute"}}),
            "request_limits.max_requests_per_unit",
            422,
        ),
        (
            json!({"name": "rl", "limits": [
                {"name": "a", "algorithm": "fixed_window", "limit": 1, "window_ms": 1_000},
                {"name": "b", "algorithm": "fixed_window", "limit": 9, "window_ms": 60_000}],
                "request_limits": {"max_requests_per_unit": 5, "unit": "minute"}}),
            "request_limits",
            422,
        ),
        (
            json!({"name": "rl", "algorithm": "concurrency", "limit": 1, "lease_ms": 1_000,
                   "request_limits": {"max_requests_per_unit": 5, "unit": "minute"}}),
            "request_limits",
            422,
        ),
    ] {
        let r = app.post("/v1/policies", &doc).await;
        assert_eq!(r.status(), status, "{doc}");
        let body: Value = r.json().await.expect("problem");
        assert_eq!(body["field"], field, "{doc}: {body}");
    }
    assert_eq!(
        app.get("/v1/policies/rl").await.status(),
        404,
        "nothing stored"
    );
}

/// The local denial cache (on by default with Redis) never answers a denial decided under a
/// request's own limit: the next request may give another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_denial_under_a_request_limit_is_not_cached_for_the_next_request() {
    const HOUR: i32 = 3;
    let app = app(Backend::Redis).await;
    app.create_policy(json!({
        "name": "uncached", "algorithm": "fixed_window", "limit": 1, "window_ms": 3_600_000,
        "descriptor": {"domain": "edge", "entries": [{"key": "uncached"}]},
        "request_limits": {"max_requests_per_unit": 100, "unit": "hour"}
    }))
    .await;
    let mut client = client(&app).await;
    let (ok, last) = oks_of_request(&mut client, &with_limit("uncached", "s", 1, HOUR), 3).await;
    assert_eq!(ok, 1, "{last:?}");
    let (ok, last) = oks_of_request(&mut client, &with_limit("uncached", "s", 3, HOUR), 3).await;
    assert_eq!(ok, 2, "3 an hour, of which 1 was used: {last:?}");
    let hits = [("policy", "uncached")];
    assert_eq!(
        metric(&app, "ratelimiter_denial_cache_hits_total", &hits).await,
        0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_calendar_quota_answers_with_its_unit_and_the_time_to_its_zones_midnight() {
    for backend in EVERY_BACKEND {
        a_calendar_quota_over_grpc(backend).await;
    }
}

async fn a_calendar_quota_over_grpc(backend: Backend) {
    use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::rate_limit::Unit;
    let app = app(backend).await;
    app.create_policy(json!({
        "name": "daily-tokyo", "algorithm": "fixed_window", "limit": 2,
        "calendar": {"unit": "day", "time_zone": "Asia/Tokyo"},
        "descriptor": {"domain": "edge", "entries": [{"key": "remote_address"}]}
    }))
    .await;
    // 22:00 in Tokyo: two hours to its midnight, whatever the instance's own zone.
    let at: jiff::Timestamp = "2026-12-04T22:00:00+09:00".parse().expect("an instant");
    app.limiter
        .clock()
        .set(u64::try_from(at.as_microsecond()).expect("after 1970"));
    let mut client = client(&app).await;
    for _ in 0..2 {
        let r = call(&mut client, by_address("10.9.9.9")).await;
        assert_eq!(r.overall_code, Code::Ok as i32, "{backend:?}: {r:?}");
    }
    let r = call(&mut client, by_address("10.9.9.9")).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{backend:?}: {r:?}");
    let status = &r.statuses[0];
    let limit = status.current_limit.as_ref().expect("a limit");
    assert_eq!(limit.unit, Unit::Day as i32, "{backend:?}: {r:?}");
    assert_eq!(limit.requests_per_unit, 2);
    let reset = status.duration_until_reset.as_ref().expect("a reset");
    assert_eq!((reset.seconds, reset.nanos), (7_200, 0), "{backend:?}");
    assert_eq!(
        header(&r, "ratelimit-policy"),
        Some("\"daily-tokyo\";q=2;w=86400"),
        "{backend:?}"
    );
    assert_eq!(
        header(&r, "ratelimit"),
        Some("\"daily-tokyo\";r=0;t=7200"),
        "{backend:?}"
    );
}

crate::on_every_store!(descriptors_keep_to_the_queue_of_http_bookings);

/// Envoy's descriptors keep to the queue that HTTP reservations make (issue 29): a descriptor
/// whose subject has a booking ahead is over the limit until the booking's time, with the wait
/// for it, even where its limit would admit by then; in a request of several descriptors,
/// nothing is taken from the others, and a subject with no booking is served as ever.
async fn descriptors_keep_to_the_queue_of_http_bookings(backend: Backend) {
    let app = app(backend).await;
    app.create_policy(json!({
        "name": "booked", "algorithm": "fixed_window", "limit": 2, "window_ms": 60_000,
        "descriptor": {"domain": "edge", "entries": [{"key": "remote_address"}]}
    }))
    .await;
    // Ten seconds into a minute, and held there: every wait below is exact.
    let at: jiff::Timestamp = "2026-12-07T12:00:10Z".parse().expect("an instant");
    app.limiter
        .clock()
        .set(u64::try_from(at.as_microsecond()).expect("after 1970"));
    assert_eq!(app.acquire("booked", "10.7.7.7", 2).await["remaining"], 0);
    // This minute is spent: one unit is booked for the next, which admits two.
    let r = app
        .post(
            "/v1/acquire",
            &json!({"policy": "booked", "key": "10.7.7.7", "max_wait_ms": 120_000}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let booking: Value = r.json().await.expect("JSON");
    assert_eq!(booking["allowed"], true, "{backend:?}: {booking}");
    assert_eq!(booking["delay_ms"], 50_000, "{backend:?}: {booking}");
    let mut client = client(&app).await;
    let r = call(&mut client, by_address("10.7.7.7")).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{backend:?}: {r:?}");
    assert_eq!(
        header(&r, "retry-after"),
        Some("50"),
        "{backend:?}: the wait for the booking: {r:?}"
    );
    // With a subject that booked nothing: over the limit as a whole, and the other keeps its 2.
    let both = request(
        "edge",
        vec![
            descriptor(&[("remote_address", "10.7.7.8")]),
            descriptor(&[("remote_address", "10.7.7.7")]),
        ],
    );
    let r = call(&mut client, both).await;
    assert_eq!(r.overall_code, Code::OverLimit as i32, "{backend:?}: {r:?}");
    let codes: Vec<i32> = r.statuses.iter().map(|s| s.code).collect();
    assert_eq!(
        codes,
        [Code::Ok as i32, Code::OverLimit as i32],
        "{backend:?}: {r:?}"
    );
    let r = app
        .post("/v1/peek", &json!({"policy": "booked", "key": "10.7.7.8"}))
        .await;
    let peek: Value = r.json().await.expect("JSON");
    assert_eq!(peek["remaining"], 2, "{backend:?}: nothing taken: {peek}");
    let r = call(&mut client, by_address("10.7.7.8")).await;
    assert_eq!(r.overall_code, Code::Ok as i32, "{backend:?}: {r:?}");
    assert_eq!(r.statuses[0].limit_remaining, 1, "{backend:?}");
}
