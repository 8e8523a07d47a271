//! The top offenders on Redis (see `store::top`): an instance's summaries of a policy folded
//! into the minute's shared ones by `lua/top.lua`, and the minutes of a window read back in one
//! pipeline, every key on the policy's own hash tag ([`key::top_keys`]).

use std::collections::HashMap;
use std::sync::LazyLock;

use redis::{FromRedisValue, Value};

use super::RedisStore;
use crate::store::top::{FoldId, Minute, Tally, DIMENSIONS, MINUTE_TTL_S};
use crate::store::{key, StoreError};

static FOLD: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(include_str!("../../../lua/top.lua")));

impl RedisStore {
    /// Folds `tallies` (one per dimension) into the policy's summaries of `minute`, each kept to
    /// at most `capacity` subjects: one script call, which does nothing when the fold `fold`
    /// was already applied.
    pub async fn fold_top(
        &self,
        policy: &str,
        minute: u64,
        capacity: usize,
        fold: FoldId,
        tallies: &[Tally; DIMENSIONS],
    ) -> Result<(), StoreError> {
        let keys = key::top_keys(&self.prefix, policy, minute);
        self.with_conn_on(Some(&keys[0]), async |conn| {
            let mut call = FOLD.prepare_invoke();
            for k in &keys {
                call.key(k.as_str());
            }
            call.arg(capacity)
                .arg(MINUTE_TTL_S)
                .arg(format!("{:016x}", fold.instance))
                .arg(fold.seq);
            for t in tallies {
                call.arg(t.total).arg(t.bound).arg(t.entries.len());
                for (member, count) in &t.entries {
                    call.arg(member.as_str()).arg(*count);
                }
            }
            let _: i64 = call.invoke_async(conn).await?;
            Ok(())
        })
        .await
    }

    /// The policy's summaries of `minutes`, in that order (a minute nobody folded into is
    /// empty): one pipeline of four reads per minute.
    pub async fn read_top(&self, policy: &str, minutes: &[u64]) -> Result<Vec<Minute>, StoreError> {
        let Some(&first) = minutes.first() else {
            return Ok(Vec::new());
        };
        let route = key::top_keys(&self.prefix, policy, first);
        let replies: Vec<Value> = self
            .with_conn_on(Some(&route[0]), async |conn| {
                let mut pipe = redis::pipe();
                for &minute in minutes {
                    let keys = key::top_keys(&self.prefix, policy, minute);
                    for set in &keys[..DIMENSIONS] {
                        pipe.cmd("ZRANGE").arg(set).arg(0).arg(-1).arg("WITHSCORES");
                    }
                    pipe.cmd("HGETALL").arg(&keys[DIMENSIONS]);
                }
                Ok(pipe.query_async(conn).await?)
            })
            .await?;
        if replies.len() != minutes.len() * (DIMENSIONS + 1) {
            return Err(StoreError::corrupt(format!(
                "the top summaries: {} replies to {} reads",
                replies.len(),
                minutes.len() * (DIMENSIONS + 1)
            )));
        }
        let mut replies = replies.into_iter();
        let mut out = Vec::with_capacity(minutes.len());
        for &minute in minutes {
            let mut sets: [Vec<(String, f64)>; DIMENSIONS] = Default::default();
            for set in &mut sets {
                let reply = replies.next().unwrap_or(Value::Nil);
                *set = FromRedisValue::from_redis_value(reply)
                    .map_err(|e| StoreError::corrupt(format!("a top summary: {e}")))?;
            }
            let meta: HashMap<String, u64> =
                FromRedisValue::from_redis_value(replies.next().unwrap_or(Value::Nil))
                    .map_err(|e| StoreError::corrupt(format!("a top summary's totals: {e}")))?;
            let field = |name: &str, d: usize| meta.get(&format!("{name}{}", d + 1)).copied();
            let mut m = Minute {
                minute,
                ..Minute::default()
            };
            for (d, (tally, set)) in m.tallies.iter_mut().zip(sets).enumerate() {
                let floor = field("f", d).unwrap_or(0);
                *tally = Tally {
                    total: field("t", d).unwrap_or(0),
                    bound: field("c", d).unwrap_or(0).saturating_add(floor),
                    // Scores are whole numbers below 2^53 (added up by the script).
                    entries: set.into_iter().map(|(k, s)| (k, s as u64)).collect(),
                };
            }
            out.push(m);
        }
        Ok(out)
    }
}
