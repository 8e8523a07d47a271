//! The service against the embedded store, without HTTP: acquires, fail modes at the embedded
//! store's bound, policy writes with their preconditions and cap, the paged list, and the cache
//! following the store.

use std::time::Duration;

use super::*;
use crate::config::LimitsSettings;
use crate::policy::{Algorithm, PolicyName};
use crate::store::{Precondition, WriteKind, WriteStatus, Written};

fn limits(max_policies: u64, max_embedded_subjects: u64) -> LimitsSettings {
    LimitsSettings {
        max_policies,
        max_embedded_subjects,
        shadow: false,
    }
}

fn service(limits: &LimitsSettings, configured: Vec<Policy>) -> RateLimiter {
    RateLimiter::new(
        AnyStore::Memory(MemoryStore::new("rl", limits.max_embedded_subjects)),
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
        let a = s.acquire("p", &key("k"), 1, now).await.expect("decided");
        assert_eq!(a.verdict.allowed, expected);
        assert!(!a.degraded);
        assert_eq!(a.etag, written.etag, "decided with the version written");
    }
    assert!(matches!(
        s.acquire("p", &key("k"), 3, now).await,
        Err(ServiceError::CostAboveQuota { quota: 2, .. })
    ));
    assert!(matches!(
        s.acquire("nope", &key("k"), 1, now).await,
        Err(ServiceError::UnknownPolicy(_))
    ));
}

#[tokio::test]
async fn a_full_embedded_store_answers_new_subjects_by_fail_mode() {
    let s = service(&limits(10, 1), vec![]);
    s.refresh().await.expect("loads");
    create(&s, policy("open", 5, FailMode::Open)).await;
    create(&s, policy("closed", 5, FailMode::Closed)).await;
    let now = Some(1_000_000);
    assert!(
        !s.acquire("open", &key("a"), 1, now)
            .await
            .expect("decided")
            .degraded
    );
    let decided = s.acquire("open", &key("a"), 1, now).await.expect("decided");
    assert_eq!(decided.decided_by, DecidedBy::Embedded);
    let open = s
        .acquire("open", &key("b"), 1, now)
        .await
        .expect("answered");
    assert!(open.degraded && open.verdict.allowed, "{open:?}");
    // Allowed without counting: never to be mistaken for the store's own allow.
    assert_eq!(open.decided_by, DecidedBy::FailOpen);
    assert!(matches!(
        s.acquire("closed", &key("c"), 1, now).await,
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
        s.acquire("p", &key("k"), 1, Some(1)).await,
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
    assert!(s.acquire("seeded", &key("k"), 1, Some(1)).await.is_ok());
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
        )
        .await
        .expect("answered");
    assert_eq!(again.status, WriteStatus::Exists);
    s.refresh().await.expect("refreshes");
    assert!(matches!(
        s.acquire("seeded", &key("k"), 1, Some(1)).await,
        Err(ServiceError::UnknownPolicy(_))
    ));
    assert_eq!(s.unready().await, None, "the deleted one is not missing");
}
