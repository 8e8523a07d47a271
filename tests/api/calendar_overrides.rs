//! Per-subject time zones (issue 28): an override's (or a tier's) `limits` give one subject's
//! calendar limit its own `time_zone`, on every store, at instants the tests choose (the
//! service's clock set by hand, as in `calendar.rs`). Each expected reset is computed here on its
//! own with jiff's day arithmetic on the bundled IANA database, not with the service's
//! `limiter::calendar`.
//!
//! The rule for a zone change: the subject's count carries until the end of the period it was
//! counted in (in the zone it was counted in); the periods after that are the new zone's.
//!
//! Redis keeps a state for the time its window has left, on its own clock; every instant here is
//! at least a minute before the end of any period a test still counts on.

use jiff::tz::TimeZone;
use serde_json::{json, Value};

use crate::helpers::{spawn_app, Backend, TestApp};
use crate::zoned::{next_midnight_us, shown_in, us, zone};

crate::on_every_store!(
    an_override_moves_one_subject_to_its_own_midnight_and_leaves_the_others_on_the_policys,
    a_count_carries_over_a_zone_change_until_the_period_it_was_counted_in_ends,
    deleting_the_override_puts_the_subject_back_on_the_policys_zone,
    bad_time_zones_are_refused_naming_the_field_and_store_nothing,
    a_time_zone_for_a_limit_no_longer_on_the_calendar_is_passed_over_and_shown_stale,
);

/// 5 a day in Berlin; a tier `jp` gives Tokyo's days.
async fn daily(app: &TestApp, name: &str) {
    app.create_policy(json!({
        "name": name, "algorithm": "fixed_window", "limit": 5,
        "calendar": {"unit": "day", "time_zone": "Europe/Berlin"},
        "tiers": {"jp": {name: {"time_zone": "Asia/Tokyo"}}}
    }))
    .await;
}

async fn acquire(app: &TestApp, policy: &str, key: &str) -> Value {
    app.acquire(policy, key, 1).await
}

async fn json_of(app: &TestApp, path: &str) -> Value {
    let r = app.get(path).await;
    assert_eq!(r.status(), 200, "GET {path}");
    r.json().await.expect("JSON")
}

/// At `at_us`, `key` has `left` units: it spends them, then is denied until `resets_us`, shown in
/// `tz` (the zone the subject is decided in).
async fn spends_then_denied_until(
    app: &TestApp,
    policy: &str,
    key: &str,
    left: u64,
    at_us: u64,
    resets_us: u64,
    tz: &TimeZone,
) {
    app.limiter.clock().set(at_us);
    let resets_at = shown_in(resets_us, tz);
    for i in 0..left {
        let v = acquire(app, policy, key).await;
        assert_eq!(v["allowed"], true, "unit {i} of {key} at {at_us}: {v}");
        assert_eq!(v["remaining"], left - i - 1, "{key} at {at_us}: {v}");
        assert_eq!(v["resets_at"], resets_at, "{key} at {at_us}: {v}");
    }
    let v = acquire(app, policy, key).await;
    let until_ms = (resets_us - at_us).div_ceil(1_000);
    assert_eq!(v["allowed"], false, "{key} at {at_us}: {v}");
    assert_eq!(v["retry_after_ms"], until_ms, "{key} at {at_us}: {v}");
    assert_eq!(v["resets_at"], resets_at, "{key} at {at_us}: {v}");
}

async fn an_override_moves_one_subject_to_its_own_midnight_and_leaves_the_others_on_the_policys(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    daily(&app, "daily").await;
    let (berlin, tokyo) = (zone("Europe/Berlin"), zone("Asia/Tokyo"));
    let written =
        json!({"match": {"key": "acme"}, "limits": {"daily": {"time_zone": "asia/tokyo"}}});
    let doc = app.create_override("daily", written).await;
    // Read back in the database's spelling, from the store.
    assert_eq!(doc["limits"], json!({"daily": {"time_zone": "Asia/Tokyo"}}));
    let id = doc["id"].as_str().expect("an id").to_owned();
    let read = json_of(&app, &format!("/v1/policies/daily/overrides/{id}")).await;
    assert_eq!(read["limits"], doc["limits"], "{read}");
    // With a limit beside it, for another subject; and the tier, for a third.
    app.create_override(
        "daily",
        json!({"match": {"key": "initech"}, "limits": {"daily": {"limit": 3, "time_zone": "Asia/Tokyo"}}}),
    )
    .await;
    app.create_override("daily", json!({"match": {"key": "kyoto"}, "tier": "jp"}))
        .await;

    // 12:00 in Berlin is 20:00 in Tokyo: Tokyo's day ends first, at 15:00 UTC.
    let noon = us("2026-12-04T12:00:00+01:00");
    let tokyo_midnight = next_midnight_us(noon, &tokyo);
    let berlin_midnight = next_midnight_us(noon, &berlin);
    assert_eq!(
        shown_in(tokyo_midnight, &tokyo),
        "2026-12-05T00:00:00+09:00"
    );
    assert_eq!(
        shown_in(berlin_midnight, &berlin),
        "2026-12-05T00:00:00+01:00"
    );
    spends_then_denied_until(&app, "daily", "acme", 5, noon, tokyo_midnight, &tokyo).await;
    spends_then_denied_until(&app, "daily", "initech", 3, noon, tokyo_midnight, &tokyo).await;
    spends_then_denied_until(&app, "daily", "kyoto", 5, noon, tokyo_midnight, &tokyo).await;
    spends_then_denied_until(&app, "daily", "other", 5, noon, berlin_midnight, &berlin).await;

    // 18:00 in Berlin is 02:00 the next day in Tokyo: acme has a new day, which ends at the next
    // Tokyo midnight, while `other` is still in Berlin's day.
    let evening = us("2026-12-04T18:00:00+01:00");
    let next_tokyo = next_midnight_us(evening, &tokyo);
    assert_eq!(shown_in(next_tokyo, &tokyo), "2026-12-06T00:00:00+09:00");
    spends_then_denied_until(&app, "daily", "acme", 5, evening, next_tokyo, &tokyo).await;
    spends_then_denied_until(&app, "daily", "kyoto", 5, evening, next_tokyo, &tokyo).await;
    spends_then_denied_until(&app, "daily", "other", 0, evening, berlin_midnight, &berlin).await;

    // `resolve` shows the calendar acme is decided with.
    let r = json_of(&app, "/v1/policies/daily/resolve?key=acme").await;
    assert_eq!(r["decided_by"], "limits", "{r}");
    assert_eq!(
        r["limits"][0]["calendar"],
        json!({"unit": "day", "time_zone": "Asia/Tokyo"}),
        "{r}"
    );
    assert!(r["candidates"][0].get("stale").is_none(), "{r}");
    let r = json_of(&app, "/v1/policies/daily/resolve?key=other").await;
    assert_eq!(r["decided_by"], "policy", "{r}");
    assert_eq!(r["limits"][0]["calendar"]["time_zone"], "Europe/Berlin");
}

async fn a_count_carries_over_a_zone_change_until_the_period_it_was_counted_in_ends(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    daily(&app, "carry").await;
    let (berlin, tokyo) = (zone("Europe/Berlin"), zone("Asia/Tokyo"));
    let noon = us("2026-12-04T12:00:00+01:00");
    let berlin_midnight = next_midnight_us(noon, &berlin);
    app.limiter.clock().set(noon);
    for i in 0..3 {
        let v = acquire(&app, "carry", "acme").await;
        assert_eq!(v["remaining"], 4 - i, "{v}");
        assert_eq!(v["resets_at"], "2026-12-05T00:00:00+01:00", "Berlin's: {v}");
    }
    app.create_override(
        "carry",
        json!({"match": {"key": "acme"}, "limits": {"carry": {"time_zone": "Asia/Tokyo"}}}),
    )
    .await;
    // Under Tokyo now, acme has the 2 its Berlin day left, until that day's end (shown in
    // Tokyo's offset: 08:00 the next morning there).
    let later = noon + 60_000_000;
    assert_eq!(
        shown_in(berlin_midnight, &tokyo),
        "2026-12-05T08:00:00+09:00"
    );
    spends_then_denied_until(&app, "carry", "acme", 2, later, berlin_midnight, &tokyo).await;
    // Tokyo's midnight passes (15:00 UTC) without a reset: the count is the Berlin day's.
    let past_tokyo_midnight = next_midnight_us(noon, &tokyo) + 3_600_000_000;
    assert!(past_tokyo_midnight < berlin_midnight - 60_000_000);
    spends_then_denied_until(
        &app,
        "carry",
        "acme",
        0,
        past_tokyo_midnight,
        berlin_midnight,
        &tokyo,
    )
    .await;
    // From the old period's end, the periods are Tokyo's: the one that holds Berlin's midnight
    // ends at the next midnight in Tokyo.
    let tokyo_end = next_midnight_us(berlin_midnight, &tokyo);
    assert_eq!(shown_in(tokyo_end, &tokyo), "2026-12-06T00:00:00+09:00");
    spends_then_denied_until(&app, "carry", "acme", 5, berlin_midnight, tokyo_end, &tokyo).await;
    // And the next Tokyo day starts at Tokyo's midnight, eight hours before Berlin's.
    let day_after = next_midnight_us(tokyo_end, &tokyo);
    spends_then_denied_until(&app, "carry", "acme", 5, tokyo_end, day_after, &tokyo).await;
}

async fn deleting_the_override_puts_the_subject_back_on_the_policys_zone(backend: Backend) {
    let app = spawn_app(backend).await;
    daily(&app, "back").await;
    let (berlin, tokyo) = (zone("Europe/Berlin"), zone("Asia/Tokyo"));
    let doc = app
        .create_override(
            "back",
            json!({"match": {"key": "acme"}, "limits": {"back": {"time_zone": "Asia/Tokyo"}}}),
        )
        .await;
    let id = doc["id"].as_str().expect("an id").to_owned();
    // 18:00 in Berlin, 02:00 in Tokyo: acme's Tokyo day ends at 15:00 UTC tomorrow.
    let evening = us("2026-12-04T18:00:00+01:00");
    let tokyo_midnight = next_midnight_us(evening, &tokyo);
    app.limiter.clock().set(evening);
    for _ in 0..3 {
        let v = acquire(&app, "back", "acme").await;
        assert_eq!(v["resets_at"], shown_in(tokyo_midnight, &tokyo), "{v}");
    }
    let r = app
        .delete(&format!("/v1/policies/back/overrides/{id}"))
        .await;
    assert_eq!(r.status(), 204);
    let r = json_of(&app, "/v1/policies/back/resolve?key=acme").await;
    assert_eq!(r["decided_by"], "policy", "{r}");
    // Back on Berlin, acme keeps what its Tokyo day left until that day ends (shown in Berlin's
    // offset, 16:00 tomorrow there); Berlin's own midnight in between resets nothing.
    assert_eq!(
        shown_in(tokyo_midnight, &berlin),
        "2026-12-05T16:00:00+01:00"
    );
    let later = evening + 60_000_000;
    spends_then_denied_until(&app, "back", "acme", 2, later, tokyo_midnight, &berlin).await;
    let past_berlin_midnight = next_midnight_us(evening, &berlin) + 3_600_000_000;
    spends_then_denied_until(
        &app,
        "back",
        "acme",
        0,
        past_berlin_midnight,
        tokyo_midnight,
        &berlin,
    )
    .await;
    // Then Berlin's days.
    let berlin_end = next_midnight_us(tokyo_midnight, &berlin);
    assert_eq!(shown_in(berlin_end, &berlin), "2026-12-06T00:00:00+01:00");
    spends_then_denied_until(&app, "back", "acme", 5, tokyo_midnight, berlin_end, &berlin).await;
}

async fn bad_time_zones_are_refused_naming_the_field_and_store_nothing(backend: Backend) {
    let app = spawn_app(backend).await;
    daily(&app, "strict").await;
    app.create_policy(json!({
        "name": "plan", "limits": [
            {"name": "hourly", "algorithm": "fixed_window", "limit": 5, "window_ms": 3_600_000},
            {"name": "daily", "algorithm": "fixed_window", "limit": 50,
             "calendar": {"unit": "day", "time_zone": "Europe/Berlin"}}
        ]
    }))
    .await;
    let good = app
        .create_override(
            "strict",
            json!({"match": {"key": "kept"}, "limits": {"strict": {"time_zone": "Asia/Tokyo"}}}),
        )
        .await;
    let kept = format!(
        "/v1/policies/strict/overrides/{}",
        good["id"].as_str().unwrap_or("")
    );
    for (policy, limits, status, field) in [
        (
            "strict",
            json!({"strict": {"time_zone": "Mars/Olympus_Mons"}}),
            422,
            "limits.strict.time_zone",
        ),
        (
            "strict",
            json!({"strict": {"limit": 9, "time_zone": "Etc/Unknown"}}),
            422,
            "limits.strict.time_zone",
        ),
        (
            "strict",
            json!({"strict": {"time_zone": 9}}),
            400,
            "limits.strict.time_zone",
        ),
        (
            "strict",
            json!({"strict": {"time_zone": null}}),
            400,
            "limits.strict.time_zone",
        ),
        (
            "plan",
            json!({"hourly": {"time_zone": "Asia/Tokyo"}}),
            422,
            "limits.hourly.time_zone",
        ),
        (
            "plan",
            json!({"daily": {"time_zone": "Asia/Tokyo"}, "hourly": {"time_zone": "UTC"}}),
            422,
            "limits.hourly.time_zone",
        ),
        (
            "plan",
            json!({"daily": {"time_zone": ["Asia/Tokyo"]}}),
            400,
            "limits.daily.time_zone",
        ),
    ] {
        let body = json!({"match": {"key": "acme"}, "limits": limits});
        let r = app
            .post(&format!("/v1/policies/{policy}/overrides"), &body)
            .await;
        assert_eq!(r.status(), status, "{body}");
        assert_eq!(
            r.headers()
                .get("content-type")
                .and_then(|v| v.to_str().ok()),
            Some("application/problem+json")
        );
        let p: Value = r.json().await.expect("problem");
        assert_eq!(p["field"], field, "{body}: {p}");
        // A replacement of the good override is refused the same way and leaves it as it was.
        if policy == "strict" {
            let body = json!({"match": {"key": "kept"}, "limits": limits});
            let r = app.put(&kept, &body).await;
            assert_eq!(r.status(), status, "{body}");
            let p: Value = r.json().await.expect("problem");
            assert_eq!(p["field"], field, "{body}: {p}");
        }
    }
    let list = json_of(&app, "/v1/policies/plan/overrides").await;
    assert_eq!(list["overrides"], json!([]), "nothing stored");
    let list = json_of(&app, "/v1/policies/strict/overrides").await;
    assert_eq!(
        list["overrides"],
        json!([good]),
        "only the good one, unchanged"
    );
    // `acme` is decided by the policy, in Berlin.
    let noon = us("2026-12-04T12:00:00+01:00");
    app.limiter.clock().set(noon);
    let v = acquire(&app, "strict", "acme").await;
    assert_eq!(v["resets_at"], "2026-12-05T00:00:00+01:00", "{v}");
    assert!(v.get("override").is_none(), "{v}");
    // A tier is checked the same way, naming its place; the policy is not created.
    let r = app
        .post(
            "/v1/policies",
            &json!({"name": "t", "algorithm": "fixed_window", "limit": 2,
                    "calendar": {"unit": "day", "time_zone": "UTC"},
                    "tiers": {"jp": {"t": {"time_zone": "Asia/Nowhere"}}}}),
        )
        .await;
    assert_eq!(r.status(), 422);
    let p: Value = r.json().await.expect("problem");
    assert_eq!(p["field"], "tiers.jp.t.time_zone", "{p}");
    assert_eq!(app.get("/v1/policies/t").await.status(), 404);
}

async fn a_time_zone_for_a_limit_no_longer_on_the_calendar_is_passed_over_and_shown_stale(
    backend: Backend,
) {
    let app = spawn_app(backend).await;
    app.create_policy(json!({
        "name": "shifty", "algorithm": "fixed_window", "limit": 5,
        "calendar": {"unit": "day", "time_zone": "Europe/Berlin"}
    }))
    .await;
    let doc = app.create_override(
        "shifty",
        json!({"match": {"key": "acme"}, "limits": {"shifty": {"limit": 7, "time_zone": "Asia/Tokyo"}}}),
    )
    .await;
    // The policy's day becomes a window of 24 hours since the epoch.
    let r = app
        .put(
            "/v1/policies/shifty",
            &json!({"name": "shifty", "algorithm": "fixed_window", "limit": 5, "window_ms": 86_400_000}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let r = json_of(&app, "/v1/policies/shifty/resolve?key=acme").await;
    assert_eq!(r["decided_by"], "limits", "its limit still applies: {r}");
    assert_eq!(r["limits"][0]["limit"], 7, "{r}");
    assert!(r["limits"][0].get("calendar").is_none(), "{r}");
    let c = &r["candidates"][0];
    assert_eq!(c["applies"], true, "{r}");
    assert_eq!(c["stale"], json!(["shifty.time_zone"]), "{r}");
    // Kept as written: a calendar again, and the zone applies again.
    let read = json_of(
        &app,
        &format!(
            "/v1/policies/shifty/overrides/{}",
            doc["id"].as_str().unwrap_or("")
        ),
    )
    .await;
    assert_eq!(read["limits"], doc["limits"], "{read}");
    let noon = us("2026-12-04T12:00:00+01:00");
    app.limiter.clock().set(noon);
    let v = acquire(&app, "shifty", "acme").await;
    assert_eq!(v["limit"], 7, "{v}");
    assert_eq!(
        v["resets_at"], "2026-12-05T00:00:00Z",
        "the epoch day's end: {v}"
    );
    let r = app
        .put(
            "/v1/policies/shifty",
            &json!({"name": "shifty", "algorithm": "fixed_window", "limit": 5,
                    "calendar": {"unit": "day", "time_zone": "Europe/Berlin"}}),
        )
        .await;
    assert_eq!(r.status(), 200);
    let r = json_of(&app, "/v1/policies/shifty/resolve?key=acme").await;
    assert!(r["candidates"][0].get("stale").is_none(), "{r}");
    assert_eq!(r["limits"][0]["calendar"]["time_zone"], "Asia/Tokyo", "{r}");
}
