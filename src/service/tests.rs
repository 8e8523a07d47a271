//! The service against the embedded store, without HTTP: acquires, fail modes at the embedded
//! store's bound, policy writes with their preconditions and cap, the paged list, and the cache
//! following the store.

use std::time::Duration;

use super::*;
use crate::config::LimitsSettings;
use crate::policy::{Algorithm, FailMode, LimitKey, PolicyName};
use crate::store::{Etag, Precondition, WriteKind, WriteStatus, Written};

fn limits(max_policies: u64, max_embedded_subjects: u64) -> LimitsSettings {
    LimitsSettings {
        max_policies,
        max_exact_overrides: 100,
        max_pattern_overrides: 10,
        max_embedded_subjects,
        shadow: false,
        denial_cache: true,
        denial_cache_ms: 1_000,
        denial_cache_entries: 1_000,
        ticketless_refunds: false,
        lease_undo_queue: 100,
        lease_sweep_budget: 1_000,
    }
}

fn service(limits: &LimitsSettings, configured: Vec<Policy>) -> RateLimiter {
    RateLimiter::new(
        MemoryStore::new("rl", limits.max_embedded_subjects).into(),
        "rl",
        configured,
        limits,
        Duration::from_secs(2),
    )
}

fn policy(name: &str, limit: u64, fail_mode: FailMode) -> Policy {
    Policy::single(
        PolicyName::parse(name).expect("valid name"),
        Algorithm::FixedWindow,
        &[limit, 60_000],
        None,
        fail_mode,
    )
}

impl RateLimiter {
    /// The same service, its clock set to `at_us` when that names a time.
    fn at(&self, at_us: Option<u64>) -> &Self {
        if let Some(t) = at_us {
            self.clock().set(t);
        }
        self
    }
}

fn key(k: &str) -> LimitKey {
    LimitKey::parse(k.into()).expect("valid key")
}

async fn create(s: &RateLimiter, p: Policy) -> Written {
    let name = p.name.clone();
    s.change_policy(WriteKind::Create, &name, Some(p), &Precondition::None)
        .await
        .expect("created")
}

#[tokio::test]
async fn acquires_decide_with_the_policy_this_instance_just_wrote() {
    let s = service(&limits(10, 100), vec![]);
    s.refresh().await.expect("loads");
    let written = create(&s, policy("p", 2, FailMode::Open)).await;
    let now = Some(1_000_000);
    for expected in [true, true, false] {
        let a = s.at(now).acquire("p", &key("k"), 1).await.expect("decided");
        assert_eq!(a.verdict.allowed, expected);
        assert!(!a.degraded);
        assert_eq!(a.etag, written.etag, "decided with the version written");
    }
    assert!(matches!(
        s.at(now).acquire("p", &key("k"), 3).await,
        Err(ServiceError::CostAboveQuota { quota: 2, .. })
    ));
    assert!(matches!(
        s.at(now).acquire("nope", &key("k"), 1).await,
        Err(ServiceError::UnknownPolicy(_))
    ));
}

#[tokio::test]
async fn the_cache_holds_the_incarnation_this_instance_just_wrote_as_the_store_does() {
    let s = service(&limits(10, 100), vec![]);
    s.refresh().await.expect("loads");
    let name = PolicyName::parse("p").expect("valid");
    let created = create(&s, policy("p", 2, FailMode::Open)).await;
    let replaced = s
        .change_policy(
            WriteKind::Put,
            &name,
            Some(policy("p", 3, FailMode::Open)),
            &Precondition::None,
        )
        .await
        .expect("replaced");
    assert_eq!(replaced.status, WriteStatus::Replaced);
    assert!(created.incarnation > 0);
    assert_eq!(replaced.incarnation, created.incarnation);
    let cached = s.policy("p").await.expect("cached").policy;
    let (stored, _) = s.get_policy(&name).await.expect("stored");
    assert_eq!(cached.incarnation(), replaced.incarnation);
    assert_eq!(stored.incarnation(), replaced.incarnation);
}

#[tokio::test]
async fn a_full_embedded_store_answers_new_subjects_by_fail_mode() {
    let s = service(&limits(10, 1), vec![]);
    s.refresh().await.expect("loads");
    create(&s, policy("open", 5, FailMode::Open)).await;
    create(&s, policy("closed", 5, FailMode::Closed)).await;
    let now = Some(1_000_000);
    assert!(
        !s.at(now)
            .acquire("open", &key("a"), 1)
            .await
            .expect("decided")
            .degraded
    );
    let decided = s
        .at(now)
        .acquire("open", &key("a"), 1)
        .await
        .expect("decided");
    assert_eq!(decided.decided_by, DecidedBy::Embedded);
    let open = s
        .at(now)
        .acquire("open", &key("b"), 1)
        .await
        .expect("answered");
    assert!(open.degraded && open.verdict.allowed, "{open:?}");
    // Allowed without counting: never to be mistaken for the store's own allow.
    assert_eq!(open.decided_by, DecidedBy::FailOpen);
    assert!(matches!(
        s.at(now).acquire("closed", &key("c"), 1).await,
        Err(ServiceError::Store(StoreError::Full(_)))
    ));
}

#[tokio::test]
async fn writes_follow_their_preconditions_and_the_cap() {
    let s = service(&limits(1, 100), vec![]);
    s.refresh().await.expect("loads");
    let first = create(&s, policy("p", 1, FailMode::Open)).await;
    let name = PolicyName::parse("p").expect("valid");
    let stale = Precondition::Matches("elsewhere.1".into());
    assert!(matches!(
        s.change_policy(WriteKind::Put, &name, Some(policy("p", 2, FailMode::Open)), &stale)
            .await,
        Err(ServiceError::PreconditionFailed { current: Some(ref etag) }) if *etag == first.etag
    ));
    let current = Precondition::Matches(first.etag.to_string());
    let replaced = s
        .change_policy(
            WriteKind::Put,
            &name,
            Some(policy("p", 2, FailMode::Open)),
            &current,
        )
        .await
        .expect("replaced");
    assert_eq!(replaced.status, WriteStatus::Replaced);
    assert!(replaced.etag.version > first.etag.version);
    let other = policy("q", 1, FailMode::Open);
    let q = other.name.clone();
    assert!(matches!(
        s.change_policy(WriteKind::Create, &q, Some(other), &Precondition::None)
            .await,
        Err(ServiceError::TooManyPolicies(1))
    ));
    assert!(matches!(
        s.change_policy(
            WriteKind::Put,
            &name,
            Some(policy("p", 3, FailMode::Open)),
            &Precondition::Absent
        )
        .await,
        Err(ServiceError::PreconditionFailed { .. })
    ));
    s.change_policy(WriteKind::Delete, &name, None, &Precondition::None)
        .await
        .expect("deleted");
    assert!(matches!(
        s.at(Some(1)).acquire("p", &key("k"), 1).await,
        Err(ServiceError::UnknownPolicy(_))
    ));
}

#[tokio::test]
async fn the_list_comes_in_pages_sorted_by_name_with_a_cursor() {
    let s = service(&limits(100, 100), vec![]);
    s.refresh().await.expect("loads");
    for name in ["c", "a", "e", "b", "d"] {
        create(&s, policy(name, 1, FailMode::Open)).await;
    }
    let (page, next) = s.list_policies(None, 2).await.expect("listed");
    let names = |page: &[(Arc<Policy>, Etag)]| -> Vec<String> {
        page.iter().map(|(p, _)| p.name.to_string()).collect()
    };
    assert_eq!(
        (names(&page), next.as_deref()),
        (vec!["a".into(), "b".into()], Some("b"))
    );
    let (page, next) = s.list_policies(Some("b"), 2).await.expect("listed");
    assert_eq!(
        (names(&page), next.as_deref()),
        (vec!["c".into(), "d".into()], Some("d"))
    );
    let (page, next) = s.list_policies(Some("d"), 2).await.expect("listed");
    assert_eq!((names(&page), next), (vec!["e".to_owned()], None));
}

#[tokio::test]
async fn configured_policies_are_seeded_once_and_a_deletion_sticks() {
    let s = service(&limits(100, 100), vec![policy("seeded", 3, FailMode::Open)]);
    s.refresh().await.expect("loads and seeds");
    assert!(s.at(Some(1)).acquire("seeded", &key("k"), 1).await.is_ok());
    let name = PolicyName::parse("seeded").expect("valid");
    s.change_policy(WriteKind::Delete, &name, None, &Precondition::None)
        .await
        .expect("deleted");
    // Seeding again, as an instance meeting this store with the same file would, creates
    // nothing: the store remembers what it seeded.
    let again = s
        .write(
            WriteKind::Seed,
            Some(&name),
            Some(&policy("seeded", 3, FailMode::Open)),
            &Precondition::None,
            None,
        )
        .await
        .expect("answered");
    assert_eq!(again.status, WriteStatus::Exists);
    s.refresh().await.expect("refreshes");
    assert!(matches!(
        s.at(Some(1)).acquire("seeded", &key("k"), 1).await,
        Err(ServiceError::UnknownPolicy(_))
    ));
    assert_eq!(s.unready().await, None, "the deleted one is not missing");
}

fn concurrency(name: &str, limit: u64, lease_ms: u64, fail_mode: FailMode) -> Policy {
    Policy::concurrent(
        PolicyName::parse(name).expect("valid name"),
        crate::policy::concurrency::Params {
            limit,
            lease_us: lease_ms * 1_000,
            // Calls here may ask for up to a day; the default bound is held by its own test.
            max_lease_us: crate::limiter::concurrency::MAX_LEASE_MS * 1_000,
        },
        None,
        fail_mode,
    )
}

const T0: u64 = 1_000_000_000;

#[tokio::test]
async fn a_lease_holds_its_units_until_released_or_expired_and_a_renewal_extends_it() {
    let s = service(&limits(10, 100), vec![]);
    s.refresh().await.expect("loads");
    create(&s, concurrency("c", 2, 1_000, FailMode::Open)).await;
    let a = s
        .at(Some(T0))
        .take_lease("c", key("k"), 1, None)
        .await
        .expect("answered");
    assert!(a.granted(), "{a:?}");
    assert_eq!(a.decided_by, DecidedBy::Embedded);
    assert_eq!((a.answer.in_use, a.remaining()), (1, 1));
    assert_eq!(a.answer.expires_in_us, 1_000_000, "the policy's lease_ms");
    let a = a.lease.expect("an id");
    let b = s
        .at(Some(T0))
        .take_lease("c", key("k"), 1, Some(5_000))
        .await
        .expect("answered");
    assert_eq!(b.answer.expires_in_us, 5_000_000, "the call's lease_ms");
    let b = b.lease.expect("an id");
    let denied = s
        .at(Some(T0 + 100_000))
        .take_lease("c", key("k"), 1, None)
        .await
        .expect("answered");
    assert!(!denied.granted() && denied.lease.is_none(), "{denied:?}");
    assert_eq!(denied.answer.retry_after_us, 900_000, "until `a` expires");
    assert_eq!(denied.remaining(), 0);
    // Other subjects are independent.
    assert!(s
        .at(Some(T0))
        .take_lease("c", key("other"), 2, None)
        .await
        .expect("answered")
        .granted());

    let renewed = s
        .at(Some(T0 + 500_000))
        .renew_lease(a.clone(), Some(2_000))
        .await
        .expect("live");
    assert_eq!(renewed.answer.expires_in_us, 2_000_000);
    assert_eq!(renewed.lease.as_ref(), Some(&a));
    // Past its first expiry, `a` is still held.
    assert!(!s
        .at(Some(T0 + 1_500_000))
        .take_lease("c", key("k"), 1, None)
        .await
        .expect("answered")
        .granted());
    // Past its renewed expiry, it is gone: not renewable, and its slot is free.
    assert!(matches!(
        s.at(Some(T0 + 2_500_000))
            .renew_lease(a.clone(), None)
            .await,
        Err(ServiceError::UnknownLease(_))
    ));
    let c = s
        .at(Some(T0 + 2_500_000))
        .take_lease("c", key("k"), 1, None)
        .await
        .expect("answered");
    assert!(c.granted(), "{c:?}");
    assert_eq!(c.answer.in_use, 2, "b and c");

    // Release is idempotent, and only a live lease counts as released.
    let released = s
        .at(Some(T0 + 2_600_000))
        .release_lease(b.clone())
        .await
        .expect("answered");
    assert_eq!(
        released,
        Released {
            was_live: true,
            decided_by: Some(DecidedBy::Embedded)
        }
    );
    let again = s
        .at(Some(T0 + 2_600_000))
        .release_lease(b.clone())
        .await
        .expect("answered");
    assert!(!again.was_live);
    assert!(matches!(
        s.at(Some(T0 + 2_700_000)).renew_lease(b, None).await,
        Err(ServiceError::UnknownLease(_))
    ));
}

#[tokio::test]
async fn a_lease_id_names_one_subject_and_one_lease() {
    let s = service(&limits(10, 100), vec![]);
    s.refresh().await.expect("loads");
    create(&s, concurrency("c", 5, 60_000, FailMode::Open)).await;
    let a = s
        .at(Some(T0))
        .take_lease("c", key("k"), 2, None)
        .await
        .expect("answered")
        .lease
        .expect("granted");
    let text = a.to_string();
    // The same random part with another cost, or for another subject: no such lease.
    let other_cost = format!("{}~1", text.rsplit_once('~').expect("cost").0);
    let other_key = text.replace(
        &format!("~{}~", "aw"), // base64url of "k"
        &format!("~{}~", "bw"), // of "o"
    );
    assert_ne!(other_key, text);
    for forged in [other_cost, other_key] {
        let id = LeaseId::parse(&forged).expect("well-formed");
        assert!(matches!(
            s.at(Some(T0 + 1)).renew_lease(id.clone(), None).await,
            Err(ServiceError::UnknownLease(_))
        ));
        assert!(
            !s.at(Some(T0 + 1))
                .release_lease(id)
                .await
                .expect("answered")
                .was_live
        );
    }
    // Untouched by either.
    assert!(s.at(Some(T0 + 2)).renew_lease(a, None).await.is_ok());
}

#[tokio::test]
async fn a_lowered_limit_keeps_leases_and_refuses_new_ones_until_enough_end() {
    let s = service(&limits(10, 100), vec![]);
    s.refresh().await.expect("loads");
    create(&s, concurrency("c", 3, 60_000, FailMode::Open)).await;
    let mut held = Vec::new();
    for _ in 0..3 {
        let l = s
            .at(Some(T0))
            .take_lease("c", key("k"), 1, None)
            .await
            .expect("answered");
        held.push(l.lease.expect("granted"));
    }
    let name = PolicyName::parse("c").expect("valid");
    s.change_policy(
        WriteKind::Put,
        &name,
        Some(concurrency("c", 1, 60_000, FailMode::Open)),
        &Precondition::None,
    )
    .await
    .expect("replaced");
    let take = || s.at(Some(T0 + 1)).take_lease("c", key("k"), 1, None);
    let denied = take().await.expect("answered");
    assert!(!denied.granted());
    assert_eq!((denied.answer.in_use, denied.remaining()), (3, 0));
    assert!(s
        .at(Some(T0 + 1))
        .renew_lease(held[0].clone(), None)
        .await
        .is_ok());
    for id in held.drain(..2) {
        s.at(Some(T0 + 1))
            .release_lease(id)
            .await
            .expect("released");
    }
    assert!(!take().await.expect("answered").granted(), "1 held of 1");
    s.at(Some(T0 + 1))
        .release_lease(held.remove(0))
        .await
        .expect("released");
    assert!(take().await.expect("answered").granted());
}

#[tokio::test]
async fn deleting_a_concurrency_policy_makes_its_leases_unknown() {
    let s = service(&limits(10, 100), vec![]);
    s.refresh().await.expect("loads");
    create(&s, concurrency("c", 3, 60_000, FailMode::Open)).await;
    let a = s
        .at(Some(T0))
        .take_lease("c", key("k"), 1, None)
        .await
        .expect("answered")
        .lease
        .expect("granted");
    let name = PolicyName::parse("c").expect("valid");
    s.change_policy(WriteKind::Delete, &name, None, &Precondition::None)
        .await
        .expect("deleted");
    assert!(matches!(
        s.at(Some(T0 + 1)).renew_lease(a.clone(), None).await,
        Err(ServiceError::UnknownPolicy(_))
    ));
    assert_eq!(
        s.at(Some(T0 + 1))
            .release_lease(a.clone())
            .await
            .expect("answered"),
        Released {
            was_live: false,
            decided_by: None
        }
    );
    // A rate policy of the same name does not know it either.
    create(&s, policy("c", 3, FailMode::Open)).await;
    assert!(matches!(
        s.at(Some(T0 + 1)).renew_lease(a.clone(), None).await,
        Err(ServiceError::UnknownLease(_))
    ));
    assert!(
        !s.at(Some(T0 + 1))
            .release_lease(a)
            .await
            .expect("answered")
            .was_live
    );
}

#[tokio::test]
async fn a_lease_longer_than_the_policy_s_max_lease_ms_is_refused_naming_lease_ms() {
    let s = service(&limits(10, 100), vec![]);
    s.refresh().await.expect("loads");
    let mut params = crate::policy::concurrency::Params {
        limit: 2,
        lease_us: 1_000_000,
        max_lease_us: 1_000_000,
    };
    let bounded = |name: &str, params| {
        Policy::concurrent(
            PolicyName::parse(name).expect("valid name"),
            params,
            None,
            FailMode::Open,
        )
    };
    create(&s, bounded("short", params)).await;
    params.max_lease_us = 5_000_000;
    create(&s, bounded("longer", params)).await;
    let too_long = s
        .at(Some(T0))
        .take_lease("short", key("k"), 1, Some(1_001))
        .await;
    assert!(
        matches!(
            too_long,
            Err(ServiceError::LeaseTooLong {
                asked: 1_001,
                max: 1_000
            })
        ),
        "{too_long:?}"
    );
    let a = s
        .at(Some(T0))
        .take_lease("longer", key("k"), 1, Some(5_000))
        .await
        .expect("answered")
        .lease
        .expect("granted");
    assert!(matches!(
        s.at(Some(T0)).renew_lease(a.clone(), Some(5_001)).await,
        Err(ServiceError::LeaseTooLong { max: 5_000, .. })
    ));
    // The refused calls took nothing: one unit is held, one free.
    let r = s.at(Some(T0)).renew_lease(a, None).await.expect("live");
    assert_eq!(r.answer.in_use, 1);
}

#[tokio::test]
async fn rate_and_concurrency_policies_refuse_each_others_operations() {
    let s = service(&limits(10, 100), vec![]);
    s.refresh().await.expect("loads");
    create(&s, concurrency("c", 3, 60_000, FailMode::Open)).await;
    create(&s, policy("r", 3, FailMode::Open)).await;
    let asks = [
        Ask::Acquire { cost: 1 },
        Ask::Peek { cost: 1 },
        Ask::Report { cost: 1 },
        Ask::Refund {
            cost: 1,
            ticket: None,
        },
    ];
    for ask in asks {
        assert!(matches!(
            s.at(Some(T0)).decide("c", &key("k"), ask).await,
            Err(ServiceError::ConcurrencyPolicy(_))
        ));
    }
    // A reset of a concurrency policy's subject ends its leases instead.
    let held = s
        .at(None)
        .take_lease("c", key("k"), 3, None)
        .await
        .expect("answered");
    s.reset("c", &key("k")).await.expect("reset");
    assert!(matches!(
        s.at(None)
            .renew_lease(held.lease.expect("granted"), None)
            .await,
        Err(ServiceError::UnknownLease(_))
    ));
    assert!(s
        .at(None)
        .take_lease("c", key("k"), 3, None)
        .await
        .expect("answered")
        .granted());
    assert!(matches!(
        s.at(Some(T0)).take_lease("r", key("k"), 1, None).await,
        Err(ServiceError::RatePolicy(_))
    ));
    assert!(matches!(
        s.at(Some(T0)).take_lease("c", key("k"), 4, None).await,
        Err(ServiceError::CostAboveQuota {
            quota: 3,
            field: "limit",
            ..
        })
    ));
}

#[tokio::test]
async fn a_full_embedded_store_answers_leases_by_fail_mode() {
    let s = service(&limits(10, 1), vec![]);
    s.refresh().await.expect("loads");
    create(&s, concurrency("open", 5, 60_000, FailMode::Open)).await;
    create(&s, concurrency("closed", 5, 60_000, FailMode::Closed)).await;
    create(&s, concurrency("local", 5, 60_000, FailMode::Local)).await;
    let held = s
        .at(Some(T0))
        .take_lease("open", key("a"), 1, None)
        .await
        .expect("answered");
    assert_eq!(held.decided_by, DecidedBy::Embedded);
    // The one subject the store may hold is taken: a new subject is answered by fail mode.
    let open = s
        .at(Some(T0))
        .take_lease("open", key("b"), 2, None)
        .await
        .expect("answered");
    assert!(open.granted(), "{open:?}");
    assert_eq!(open.decided_by, DecidedBy::FailOpen);
    assert!(open.decided_by.is_degraded());
    assert_eq!((open.answer.in_use, open.remaining()), (2, 3));
    // Stored nowhere: the store, asked, does not know it; releasing it never fails.
    let id = open.lease.expect("an id");
    assert!(matches!(
        s.at(Some(T0 + 1)).renew_lease(id.clone(), None).await,
        Err(ServiceError::UnknownLease(_))
    ));
    assert!(
        !s.at(Some(T0 + 1))
            .release_lease(id)
            .await
            .expect("answered")
            .was_live
    );
    assert!(matches!(
        s.at(Some(T0)).take_lease("closed", key("c"), 1, None).await,
        Err(ServiceError::Store(StoreError::Full(_)))
    ));
    // `local` on the embedded store has no other store to decide with: it answers as `open`.
    let local = s
        .at(Some(T0))
        .take_lease("local", key("d"), 1, None)
        .await
        .expect("answered");
    assert_eq!(local.decided_by, DecidedBy::FailOpen);
}

/// The value of one series in the Prometheus text, 0 when absent.
fn series(text: &str, name: &str, labels: &str) -> f64 {
    let prefix = format!("{name}{{{labels}}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

#[tokio::test]
async fn lease_metrics_count_each_event_and_the_leases_in_use() {
    let s = service(&limits(10, 100), vec![]);
    s.refresh().await.expect("loads");
    create(&s, concurrency("metered-leases", 2, 1_000, FailMode::Open)).await;
    let take = |at: u64, lease_ms: u64| {
        s.at(Some(at))
            .take_lease("metered-leases", key("k"), 1, Some(lease_ms))
    };
    let _a = take(T0, 1_000)
        .await
        .expect("answered")
        .lease
        .expect("granted");
    let b = take(T0, 5_000)
        .await
        .expect("answered")
        .lease
        .expect("granted");
    assert!(take(T0, 1_000).await.expect("answered").lease.is_none());
    s.at(Some(T0 + 1))
        .renew_lease(b.clone(), Some(5_000))
        .await
        .expect("renewed");
    // `a` expires while `b` keeps the subject's state: the next take finds it expired and takes
    // its slot. (A subject whose last lease expires goes with it, uncounted.)
    let c = take(T0 + 2_000_000, 1_000)
        .await
        .expect("answered")
        .lease
        .expect("granted");
    for id in [b.clone(), b, c] {
        s.at(Some(T0 + 2_000_001))
            .release_lease(id)
            .await
            .expect("released");
    }
    let text = s.render_metrics();
    let event = |e: &str| {
        series(
            &text,
            m::LEASES,
            &format!("policy=\"metered-leases\",event=\"{e}\""),
        )
    };
    assert_eq!(
        [
            event("granted"),
            event("denied"),
            event("renewed"),
            event("released"),
            event("expired")
        ],
        [3.0, 1.0, 1.0, 2.0, 1.0],
        "{text}"
    );
    assert_eq!(
        series(&text, m::LEASES_IN_USE, "policy=\"metered-leases\""),
        0.0,
        "{text}"
    );
}

/// The order CI met under load: the undo's release of a take that got no answer reached the
/// store before the take itself (on another Redis connection), found nothing, and was answered
/// before the take's deadline. The take then granted a lease to nobody; the release is kept
/// and sent again once the deadline has passed, and frees the slot then. The embedded store
/// decides at the system clock here (no time set by hand): the undo queue waits in real time.
#[tokio::test]
async fn a_release_that_overtook_its_take_is_sent_again_after_the_take_s_deadline() {
    use super::undo::Undo;
    use crate::limiter::concurrency::{LeaseCall, LeaseOp};
    use crate::store::memory::system_now_us;
    use crate::store::{LeasePlan, Store};

    const HOUR_US: u64 = 3_600_000_000;
    let s = service(&limits(10, 100), vec![]);
    s.refresh().await.expect("loads");
    create(&s, concurrency("ghost", 1, 3_600_000, FailMode::Closed)).await;
    let policy = s.cache.get("ghost").expect("cached").policy;
    // A step that had to come before the take's deadline and did not (a busy machine) starts
    // again with a later deadline, on another subject.
    for (attempt, margin_ms) in [200u64, 800, 3_200].into_iter().enumerate() {
        let key = key(&format!("k{attempt}"));
        let member = format!("{attempt:032x}:1");
        let deadline_us = system_now_us() + margin_ms * 1_000;
        let take = LeaseCall {
            op: LeaseOp::Take,
            member: &member,
            cost: 1,
            lease_us: HOUR_US,
            limit: 1,
            deadline_us: Some(deadline_us),
        };
        s.undos.push(Undo::new(
            policy.clone(),
            key.clone(),
            &take,
            Duration::from_micros(HOUR_US),
        ));
        // The release first: nothing to release yet.
        let waiting = s.drain_undos().await;
        let answered_by = system_now_us();
        if waiting == 0 {
            assert!(
                answered_by > deadline_us,
                "a release answered before the take's deadline without finding it was given up"
            );
            continue;
        }
        // Then the take, within its deadline: a lease nobody was given holds the only slot.
        let plan = LeasePlan {
            policy: &policy,
            key: &key,
            call: take,
            at_us: None,
        };
        let ghost = s.store.lease(&plan).await.expect("answered");
        if !ghost.ok {
            assert!(system_now_us() > deadline_us, "{ghost:?}");
            continue;
        }
        let held = s
            .take_lease("ghost", key.clone(), 1, None)
            .await
            .expect("answered");
        assert!(!held.granted(), "{held:?}");
        assert_eq!(held.answer.in_use, 1, "{held:?}");
        // After the deadline the release is sent again, and finds the lease.
        let give_up = Instant::now() + Duration::from_millis(margin_ms) + Duration::from_secs(10);
        while s.drain_undos().await > 0 {
            assert!(Instant::now() < give_up, "the release was not sent again");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let fresh = s.take_lease("ghost", key, 1, None).await.expect("answered");
        assert!(fresh.granted(), "the slot is free again: {fresh:?}");
        assert_eq!(
            fresh.answer.in_use, 1,
            "only the new lease holds it: {fresh:?}"
        );
        return;
    }
    panic!("the take never came before its deadline, even 3.2 s ahead");
}
