//! The Lua scripts, embedded in the binary and called by SHA.
//!
//! Each decision script is the [`DECISION_FLAGS`] line, `lua/common.lua`, then `lua/muldiv.lua`
//! where the algorithm multiplies large numbers, then `lua/<algorithm>.lua`, joined by newlines
//! into one chunk (the registry in [`crate::limiter`] names each algorithm's files). redis-rs sends `EVALSHA` and, on `NOSCRIPT` (a restarted or flushed Redis),
//! loads the script and retries, so a script is loaded once per Redis and never sent again in
//! steady state.
//!
//! The flags line makes every decision script a Redis 7 flagged script, which Redis checks as a
//! whole before running it: while Redis is over `maxmemory` it refuses the call with an `OOM`
//! error and runs none of it. (An unflagged script is checked only up to its first write, so a
//! write that frees memory, such as `ZREMRANGEBYSCORE`, let every later write of the same script
//! through.) On a Cluster, flagged scripts also may not touch keys of another slot than their
//! declared ones, which ours never do. Redis before 7.0 cannot run them at all: it reads `#!` as
//! a syntax error.

use redis::Script;

use crate::policy::Algorithm;

/// The first line of every decision script: flagged, with no flag that would let it write past
/// `maxmemory` (`allow-oom`) or across slots (`allow-cross-slot-keys`). The registry in
/// [`crate::limiter`] writes it (`concat!` takes only literals); a test checks they agree.
pub const DECISION_FLAGS: &str = "#!lua";

/// The source of an algorithm's decision script, as sent to Redis.
pub const fn source(algorithm: Algorithm) -> &'static str {
    algorithm.script()
}

/// The source of every script the service runs.
pub fn sources() -> impl Iterator<Item = &'static str> {
    Algorithm::ALL.into_iter().map(source).chain([
        include_str!("../../lua/policy_write.lua"),
        include_str!("../../lua/policy_read.lua"),
    ])
}

/// Every script, with its SHA computed once.
pub struct Scripts {
    decisions: [Script; Algorithm::ALL.len()],
    pub policy_write: Script,
    pub policy_read: Script,
}

impl Scripts {
    pub fn new() -> Self {
        Self {
            decisions: Algorithm::ALL.map(|a| Script::new(source(a))),
            policy_write: Script::new(include_str!("../../lua/policy_write.lua")),
            policy_read: Script::new(include_str!("../../lua/policy_read.lua")),
        }
    }

    pub fn decision(&self, algorithm: Algorithm) -> &Script {
        &self.decisions[algorithm as usize]
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_decision_script_is_flagged_so_that_redis_refuses_it_whole_when_out_of_memory() {
        for a in Algorithm::ALL {
            let first = source(a).lines().next().unwrap_or_default();
            // Exactly `#!lua`: no `flags=` that could hold `allow-oom`.
            assert_eq!(first, DECISION_FLAGS, "{}", a.as_str());
        }
    }

    #[test]
    fn every_script_opens_with_its_keys_argv_and_reply() {
        let common = include_str!("../../lua/common.lua");
        let muldiv = include_str!("../../lua/muldiv.lua");
        for a in Algorithm::ALL {
            let rest = source(a)
                .strip_prefix(DECISION_FLAGS)
                .and_then(|s| s.strip_prefix('\n'))
                .expect("the flags line comes first")
                .strip_prefix(common)
                .expect("common.lua comes first")
                .trim_start();
            let own = rest.strip_prefix(muldiv).unwrap_or(rest).trim_start();
            assert!(own.starts_with(&format!("-- {}.lua", a.as_str())));
            let header: String = own
                .lines()
                .take_while(|l| l.starts_with("--") || l.is_empty())
                .collect();
            for part in ["KEYS[1]", "ARGV[1]", "Reply"] {
                assert!(header.contains(part), "{} lacks {part}", a.as_str());
            }
        }
    }

    #[test]
    fn algorithms_index_their_scripts_in_declaration_order() {
        let scripts = Scripts::new();
        for a in Algorithm::ALL {
            assert_eq!(
                scripts.decision(a).get_hash(),
                Script::new(source(a)).get_hash()
            );
        }
    }
}
