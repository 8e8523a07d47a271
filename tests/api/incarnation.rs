//! A policy's incarnation, through the `Store` trait on every store: the version of the write
//! that created it, kept by replacements, new after a deletion, and 0 for a policy stored before
//! stores kept it. Not visible over HTTP, so these tests call the stores themselves.

use std::time::Duration;

use ratelimiter::policy::{Algorithm, FailMode, Policy, PolicyName};
use ratelimiter::store::connection::ConnectionMode;
use ratelimiter::store::key::PolicyKeys;
use ratelimiter::store::{
    AnyStore, MemoryStore, PolicyWrite, Precondition, RedisStore, Store, WriteKind, WriteStatus,
    Written,
};

use crate::helpers::{Backend, TestCluster, TestRedis};

const PREFIX: &str = "rl";

/// A store of `backend`, with the Redis or Cluster behind it kept running as long as it.
struct Lab {
    store: AnyStore,
    redis: Option<TestRedis>,
    cluster: Option<TestCluster>,
}

impl Lab {
    async fn start(backend: Backend) -> Self {
        let timeout = Duration::from_secs(5);
        match backend {
            Backend::Embedded => Self {
                store: MemoryStore::new(PREFIX, 100).into(),
                redis: None,
                cluster: None,
            },
            Backend::Redis => {
                let redis = TestRedis::start();
                let store = RedisStore::open(
                    &redis.url(),
                    ConnectionMode::Multiplexed,
                    2,
                    timeout,
                    PREFIX,
                )
                .expect("store");
                Self {
                    store: store.into(),
                    redis: Some(redis),
                    cluster: None,
                }
            }
            Backend::Cluster => {
                let cluster = TestCluster::start();
                let seeds: Vec<String> = cluster
                    .nodes()
                    .iter()
                    .map(|n| format!("127.0.0.1:{}", n.port))
                    .collect();
                let store = RedisStore::open_cluster(&seeds, timeout, PREFIX)
                    .await
                    .expect("cluster store");
                Self {
                    store: store.into(),
                    redis: None,
                    cluster: Some(cluster),
                }
            }
        }
    }

    async fn write(&self, kind: WriteKind, p: &Policy) -> Written {
        self.store
            .write_policy(PolicyWrite {
                kind,
                name: &p.name,
                policy: (kind != WriteKind::Delete).then_some(p),
                precondition: &Precondition::None,
                max_policies: 100,
                seen: None,
            })
            .await
            .unwrap_or_else(|e| panic!("{kind:?} {}: {e}", p.name))
    }

    /// The incarnation `read_policy` gives `name`, checking that its document is `expected`'s.
    async fn read(&self, expected: &Policy) -> u64 {
        let (read, _) = self
            .store
            .read_policy(&expected.name)
            .await
            .expect("read")
            .unwrap_or_else(|| panic!("{} is missing", expected.name));
        assert_eq!(&read, expected, "the document reads back unchanged");
        read.incarnation()
    }

    /// The incarnation the change log gives `name` in the changes after `since`.
    async fn changed(&self, name: &PolicyName, since: u64) -> Option<u64> {
        let page = self
            .store
            .policy_changes(since, 100)
            .await
            .expect("changes");
        page.changes
            .into_iter()
            .find(|c| c.name == name.as_str())
            .and_then(|c| c.policy().cloned())
            .map(|p| p.incarnation())
    }

    /// Runs `cmd` against the Redis behind the store, on a Cluster through a cluster client (the
    /// policy keys share one hash tag, so one slot).
    async fn command(&self, cmd: &::redis::Cmd) -> ::redis::Value {
        if let Some(redis) = &self.redis {
            return cmd.query(&mut redis.conn()).expect("redis command");
        }
        let cluster = self.cluster.as_ref().expect("a Redis or a Cluster");
        let nodes: Vec<String> = cluster
            .nodes()
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect();
        let mut conn = ::redis::cluster::ClusterClient::new(nodes)
            .expect("cluster client")
            .get_async_connection()
            .await
            .expect("cluster connection");
        cmd.query_async(&mut conn).await.expect("cluster command")
    }
}

fn policy(name: &str, limit: u64) -> Policy {
    Policy::single(
        PolicyName::parse(name).expect("valid name"),
        Algorithm::FixedWindow,
        &[limit, 60_000],
        None,
        FailMode::Open,
    )
}

crate::on_every_store!(
    a_policy_keeps_the_version_that_created_it_until_it_is_deleted,
    a_change_of_kind_starts_a_new_incarnation,
);

async fn a_policy_keeps_the_version_that_created_it_until_it_is_deleted(backend: Backend) {
    let lab = Lab::start(backend).await;
    lab.write(WriteKind::Create, &policy("inc-other", 1)).await;

    let created = lab.write(WriteKind::Create, &policy("inc", 1)).await;
    assert_eq!(created.status, WriteStatus::Created);
    let n = created.incarnation;
    assert!(n > 0, "{created:?}");
    assert_eq!(n, created.etag.version, "the creating write's version");
    assert_eq!(lab.read(&policy("inc", 1)).await, n);
    assert_eq!(lab.changed(&policy("inc", 1).name, 0).await, Some(n));

    let replaced = lab.write(WriteKind::Put, &policy("inc", 2)).await;
    assert_eq!(replaced.status, WriteStatus::Replaced);
    assert!(replaced.etag.version > n);
    assert_eq!(replaced.incarnation, n, "a replacement keeps it");
    assert_eq!(lab.read(&policy("inc", 2)).await, n);
    assert_eq!(
        lab.changed(&policy("inc", 2).name, created.etag.version)
            .await,
        Some(n)
    );

    let deleted = lab.write(WriteKind::Delete, &policy("inc", 2)).await;
    assert_eq!(
        (deleted.status, deleted.incarnation),
        (WriteStatus::Deleted, 0)
    );
    let refused = lab.write(WriteKind::Create, &policy("inc-other", 3)).await;
    assert_eq!(
        (refused.status, refused.incarnation),
        (WriteStatus::Exists, 0)
    );

    // Created again by a put: a new incarnation.
    let again = lab.write(WriteKind::Put, &policy("inc", 3)).await;
    assert_eq!(again.status, WriteStatus::Created);
    let n2 = again.incarnation;
    assert!(n2 > n, "{n2} after {n}");
    assert_eq!(n2, again.etag.version);
    assert_eq!(lab.read(&policy("inc", 3)).await, n2);
    assert_eq!(lab.changed(&policy("inc", 3).name, 0).await, Some(n2));

    // And by a create.
    lab.write(WriteKind::Delete, &policy("inc", 3)).await;
    let third = lab.write(WriteKind::Create, &policy("inc", 4)).await;
    assert_eq!(third.status, WriteStatus::Created);
    assert!(third.incarnation > n2, "{third:?}");
    assert_eq!(lab.read(&policy("inc", 4)).await, third.incarnation);

    // A seed creates one too.
    let seeded = lab.write(WriteKind::Seed, &policy("inc-seeded", 1)).await;
    assert_eq!(seeded.status, WriteStatus::Created);
    assert_eq!(seeded.incarnation, seeded.etag.version);
    assert_eq!(lab.read(&policy("inc-seeded", 1)).await, seeded.incarnation);
    assert_eq!(
        lab.changed(&policy("inc-seeded", 1).name, 0).await,
        Some(seeded.incarnation)
    );
}

/// A policy hash as versions before incarnations wrote it: the document alone.
async fn a_policy_stored_before_incarnations_reads_as_0_and_keeps_0_when_replaced(
    backend: Backend,
) {
    let lab = Lab::start(backend).await;
    let created = lab.write(WriteKind::Create, &policy("legacy", 1)).await;
    assert!(created.incarnation > 0);
    let hash = PolicyKeys::new(PREFIX).hash("legacy");
    let doc = serde_json::to_string(&policy("legacy", 1).to_doc()).expect("JSON");
    lab.command(::redis::cmd("DEL").arg(&hash)).await;
    lab.command(::redis::cmd("HSET").arg(&hash).arg("doc").arg(&doc))
        .await;

    assert_eq!(lab.read(&policy("legacy", 1)).await, 0);
    assert_eq!(lab.changed(&policy("legacy", 1).name, 0).await, Some(0));

    let replaced = lab.write(WriteKind::Put, &policy("legacy", 2)).await;
    assert_eq!(
        (replaced.status, replaced.incarnation),
        (WriteStatus::Replaced, 0)
    );
    assert_eq!(lab.read(&policy("legacy", 2)).await, 0);
    assert_eq!(lab.changed(&policy("legacy", 2).name, 0).await, Some(0));
    let fields = lab.command(::redis::cmd("HKEYS").arg(&hash)).await;
    let fields = ::redis::from_redis_value::<Vec<String>>(fields).expect("field names");
    assert!(!fields.iter().any(|f| f == "born"), "absent stays absent");

    lab.write(WriteKind::Delete, &policy("legacy", 2)).await;
    let again = lab.write(WriteKind::Create, &policy("legacy", 3)).await;
    assert!(again.incarnation > created.incarnation, "{again:?}");
    assert_eq!(lab.read(&policy("legacy", 3)).await, again.incarnation);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_a_policy_stored_before_incarnations_reads_as_0_and_keeps_0_when_replaced() {
    a_policy_stored_before_incarnations_reads_as_0_and_keeps_0_when_replaced(Backend::Redis).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_a_policy_stored_before_incarnations_reads_as_0_and_keeps_0_when_replaced() {
    a_policy_stored_before_incarnations_reads_as_0_and_keeps_0_when_replaced(Backend::Cluster).await
}

fn concurrency(name: &str, limit: u64) -> Policy {
    let doc = serde_json::json!({
        "name": name, "algorithm": "concurrency", "limit": limit, "lease_ms": 60_000
    });
    ratelimiter::policy::parse_policy(&doc, None).expect("a concurrency policy")
}

/// A concurrency policy's incarnation names its leases: replaced by a rate policy and back, it
/// must not find the leases of before, so each change of kind is a new incarnation, as a
/// deletion is; a replacement of the same kind keeps it.
async fn a_change_of_kind_starts_a_new_incarnation(backend: Backend) {
    let lab = Lab::start(backend).await;
    let created = lab.write(WriteKind::Create, &concurrency("kind", 2)).await;
    let n = created.incarnation;
    let same = lab.write(WriteKind::Put, &concurrency("kind", 3)).await;
    assert_eq!(same.incarnation, n, "same kind: kept");

    let rate = lab.write(WriteKind::Put, &policy("kind", 5)).await;
    assert_eq!(rate.status, WriteStatus::Replaced);
    assert_eq!(rate.incarnation, rate.etag.version, "to rate: new");
    assert_eq!(lab.read(&policy("kind", 5)).await, rate.incarnation);

    let back = lab.write(WriteKind::Put, &concurrency("kind", 2)).await;
    assert_eq!(back.status, WriteStatus::Replaced);
    assert_eq!(back.incarnation, back.etag.version, "back: new again");
    assert!(back.incarnation > rate.incarnation && rate.incarnation > n);
    assert_eq!(lab.read(&concurrency("kind", 2)).await, back.incarnation);
    assert_eq!(
        lab.changed(&concurrency("kind", 2).name, rate.etag.version)
            .await,
        Some(back.incarnation)
    );
}

fn serving(name: &str, key: &str) -> Policy {
    let doc = serde_json::json!({
        "name": name, "algorithm": "fixed_window", "limit": 5, "window_ms": 60_000,
        "descriptor": {"domain": "d", "entries": [{"key": key}]}
    });
    ratelimiter::policy::parse_policy(&doc, None).expect("a policy serving a descriptor")
}

/// The store refuses a second policy of one descriptor shape itself, naming the first; a policy
/// stored before hashes kept their shape is judged by the shape the writer saw it have, so that
/// replacing it with its own shape is never refused.
async fn the_store_lets_one_policy_claim_a_shape(backend: Backend) {
    let lab = Lab::start(backend).await;
    lab.write(WriteKind::Create, &serving("owner", "s")).await;
    let refused = lab.write(WriteKind::Create, &serving("rival", "s")).await;
    assert_eq!(refused.status, WriteStatus::Claimed);
    assert_eq!(refused.claimed_by.as_deref(), Some("owner"));

    // `legacy` serves `s` too, in a hash written before hashes kept their shape.
    lab.write(WriteKind::Create, &serving("legacy", "t")).await;
    let hash = PolicyKeys::new(PREFIX).hash("legacy");
    let doc = serde_json::to_string(&serving("legacy", "s").to_doc()).expect("JSON");
    lab.command(::redis::cmd("HDEL").arg(&hash).arg("shape").arg("kind"))
        .await;
    lab.command(::redis::cmd("HSET").arg(&hash).arg("doc").arg(&doc))
        .await;
    let seen = serving("legacy", "s");
    let kept = lab
        .store
        .write_policy(PolicyWrite {
            kind: WriteKind::Put,
            name: &seen.name,
            policy: Some(&seen),
            precondition: &Precondition::None,
            max_policies: 100,
            seen: Some(&seen),
        })
        .await
        .expect("written");
    assert_eq!(kept.status, WriteStatus::Replaced, "{kept:?}");
    assert_eq!(lab.read(&seen).await, kept.incarnation);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_redis_the_store_lets_one_policy_claim_a_shape() {
    the_store_lets_one_policy_claim_a_shape(Backend::Redis).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_store_lets_one_policy_claim_a_shape() {
    the_store_lets_one_policy_claim_a_shape(Backend::Cluster).await
}
