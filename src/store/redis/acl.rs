//! The least privilege the service needs on Redis, in one place: the commands it sends, the
//! commands its scripts call, its keys and its channel ([`rules`], printed by `ratelimiter
//! --print-acl` and shown in docs/redis.md), and the start-up check that the configured user
//! has each of them ([`RedisStore::require_permissions`]), which names what is missing instead
//! of letting every decision fail later.
//!
//! Always allowed by Redis, so not in the rules: `AUTH` and `HELLO`. Optional: `INFO` (without it
//! start-up cannot read the Redis version, and only warns), `CLIENT SETINFO` (Redis 7.2 and
//! later: redis-rs names its library on connect and ignores a refusal) and `SELECT` (only for a
//! URL that names a database other than 0).

use redis::{RedisError, Value};

use super::RedisStore;
use crate::store::{key, StoreError};

/// The commands the service sends itself, each with what it is for.
pub const DIRECT: &[(&str, &str)] = &[
    ("ping", "start-up and readiness"),
    (
        "info",
        "start-up reads the Redis version (optional: refused, it only warns)",
    ),
    ("eval", "a Cluster master's readiness probe"),
    ("evalsha", "every decision, policy change and lease call"),
    ("evalsha_ro", "peeks and policy reads, which write nothing"),
    (
        "script|load",
        "loading the scripts, at start-up and after NOSCRIPT",
    ),
    ("publish", "the denial cache's invalidations"),
    ("subscribe", "the denial cache's invalidations"),
    ("set", "creating the ring of keys that sign refund tickets"),
    ("unlink", "reset"),
    ("zadd", "the index of concurrency policies that hold leases"),
    ("zrange", "the lease sweep reads that index"),
    ("cluster|slots", "a Cluster's slot map"),
    ("asking", "a Cluster's slot migrations (the ASK redirect)"),
];

/// Each command the scripts call (`lua/` and the few scripts written in the Rust code), with
/// the arguments the start-up probe tries it with: `@1` to `@4` are its keys, a sorted set, a
/// hash, a set and a string (see `lua/acl_probe.lua`).
pub const SCRIPTED: &[(&str, &[&str])] = &[
    ("time", &[]),
    ("get", &["@4"]),
    ("mget", &["@4"]),
    ("set", &["@4", "1", "PX", "10000"]),
    ("psetex", &["@4", "10000", "1"]),
    ("del", &["@4"]),
    ("unlink", &["@4"]),
    ("hset", &["@2", "f", "1"]),
    ("hget", &["@2", "f"]),
    ("hmget", &["@2", "f"]),
    ("hgetall", &["@2"]),
    ("hkeys", &["@2"]),
    ("hlen", &["@2"]),
    ("hincrby", &["@2", "n", "1"]),
    ("hdel", &["@2", "f"]),
    ("pexpire", &["@2", "10000"]),
    ("zadd", &["@1", "1", "m"]),
    ("zincrby", &["@1", "1", "m"]),
    ("zscore", &["@1", "m"]),
    ("zcard", &["@1"]),
    ("zcount", &["@1", "0", "1"]),
    ("zrange", &["@1", "0", "0"]),
    ("zrangebyscore", &["@1", "0", "1"]),
    ("zrem", &["@1", "m"]),
    ("zremrangebyrank", &["@1", "0", "0"]),
    ("zremrangebyscore", &["@1", "0", "0"]),
    ("zpopmin", &["@1"]),
    ("expire", &["@1", "10"]),
    ("sadd", &["@3", "m"]),
    ("sismember", &["@3", "m"]),
    ("smembers", &["@3"]),
    ("pexpireat", &["@3", "1"]),
];

/// The one channel the service publishes and subscribes to (see [`RedisStore::denials_channel`]).
fn channel(prefix: &str) -> String {
    format!("{prefix}:denials")
}

/// The ACL rules of a user that can do everything the service does under `prefix` and nothing
/// else, in the form `ACL SETUSER` and an ACL file take after the user's name and password:
/// its keys `<prefix>:*`, its channel `<prefix>:denials`, and [`DIRECT`] and [`SCRIPTED`]'s
/// commands (a script runs as its caller, with the caller's permissions).
pub fn rules(prefix: &str) -> String {
    let mut commands: Vec<&str> = DIRECT
        .iter()
        .map(|(c, _)| *c)
        .chain(SCRIPTED.iter().map(|(c, _)| *c))
        .collect();
    let mut seen = std::collections::HashSet::new();
    commands.retain(|c| seen.insert(*c));
    let mut out = format!(
        "resetkeys ~{prefix}:* resetchannels &{} -@all",
        channel(prefix)
    );
    for c in commands {
        out.push_str(" +");
        out.push_str(c);
    }
    out
}

/// What a refusal says is missing, as the ACL rule that grants it: `+<command>`, the key
/// pattern or the channel; `None` when `message` is no refusal of the ACL's. `command` is what
/// was refused inside a script, whose refusal does not name it.
fn missing_rule(message: &str, command: &str, prefix: &str) -> Option<String> {
    if let Some(rest) = message.split("permissions to run the '").nth(1) {
        return rest.split('\'').next().map(|c| format!("+{c}"));
    }
    if message.contains("can't run this command") {
        return Some(format!("+{command}"));
    }
    if message.contains("access one of the keys") || message.contains("can't access") {
        return Some(format!("~{prefix}:*"));
    }
    if message.contains("access one of the channels") {
        return Some(format!("&{}", channel(prefix)));
    }
    None
}

/// The rule a refused direct call lacks, if the ACL refused it.
fn refused(result: &Result<Value, RedisError>, command: &str, prefix: &str) -> Option<String> {
    match result {
        Err(e) if e.code() == Some("NOPERM") => {
            missing_rule(&e.to_string(), command, prefix).or_else(|| Some(format!("+{command}")))
        }
        _ => None,
    }
}

/// What the check publishes on the channel: no `:` and no trailing `/`, so it names no subject
/// and no policy, and every instance ignores it (`service::denials`).
pub const PROBE_MESSAGE: &str = "probe";

const PROBE: &str = include_str!("../../../lua/acl_probe.lua");
/// A script that writes nothing, for `EVALSHA_RO`.
const READ_ONLY: &str = "#!lua flags=no-writes\nreturn 1";

impl RedisStore {
    /// Fails, naming each ACL rule it lacks, unless the Redis user may run every command the
    /// service sends and its scripts call, on its keys and its channel (see [`rules`]). Each
    /// is tried once, on probe keys that it leaves behind for at most ten seconds; a command
    /// that fails for another reason (out of memory, say) is not the ACL's doing and is let
    /// through. On a Cluster, each call goes where the service's would.
    pub async fn require_permissions(&self) -> Result<(), StoreError> {
        let prefix = self.prefix.clone();
        let keys: Vec<String> = ["z", "h", "s", "k"]
            .iter()
            .map(|k| key::acl_probe(&prefix, k))
            .collect();
        let mut missing: Vec<String> = Vec::new();
        let mut note = |rule: Option<String>| {
            if let Some(rule) = rule {
                if !missing.contains(&rule) {
                    missing.push(rule);
                }
            }
        };

        // The scripts' commands, in one script run by EVAL.
        let mut eval = redis::cmd("EVAL");
        eval.arg(PROBE).arg(keys.len()).arg(&keys);
        for (name, args) in SCRIPTED {
            eval.arg(*name).arg(args.len()).arg(*args);
        }
        let answer = self.ask(Some(&keys[0]), eval).await?;
        note(refused(&answer, "eval", &prefix));
        if let Ok(Value::Array(items)) = &answer {
            for pair in items.chunks(2) {
                if let [name, error] = pair {
                    let name = text(name);
                    note(missing_rule(&text(error), &name, &prefix).or(Some(format!("+{name}"))));
                }
            }
        }

        let sha = redis::Script::new(READ_ONLY).get_hash().to_owned();
        let (z, k) = (keys[0].as_str(), keys[3].as_str());
        // On one Redis start-up has sent PING already; a Cluster's readiness sends it too.
        let mut direct = vec![
            ("script|load", command(&["SCRIPT", "LOAD", READ_ONLY])),
            ("evalsha", command(&["EVALSHA", &sha, "1", z])),
            ("evalsha_ro", command(&["EVALSHA_RO", &sha, "1", z])),
            ("ping", command(&["PING"])),
            ("set", command(&["SET", k, "1", "PX", "10000"])),
            ("zadd", command(&["ZADD", z, "0", "probe"])),
            ("zrange", command(&["ZRANGE", z, "0", "0"])),
            ("unlink", command(&["UNLINK", z, k])),
            (
                "publish",
                command(&["PUBLISH", &channel(&prefix), PROBE_MESSAGE]),
            ),
        ];
        if self.is_cluster() {
            direct.push(("cluster|slots", command(&["CLUSTER", "SLOTS"])));
            direct.push(("asking", command(&["ASKING"])));
        }
        for (name, cmd) in direct {
            note(refused(&self.ask(Some(z), cmd).await?, name, &prefix));
        }
        match self.subscribe(&self.denials_channel()).await {
            Ok(subscription) => drop(subscription),
            Err(e) => note(missing_rule(&e.to_string(), "subscribe", &prefix)),
        }

        if missing.is_empty() {
            return Ok(());
        }
        Err(StoreError::server(format!(
            "the Redis user lacks what the service needs: {} (`ratelimiter --print-acl` prints \
             every rule it needs; see docs/redis.md#acl)",
            missing.join(" ")
        )))
    }

    /// Sends `cmd` (on a Cluster, where its keys are, or through the breaker of `key`'s master
    /// when given) and answers what Redis answered, refusals included; only a failure to reach
    /// Redis is an error.
    async fn ask(
        &self,
        key: Option<&str>,
        cmd: redis::Cmd,
    ) -> Result<Result<Value, RedisError>, StoreError> {
        self.with_conn_on(key, async |conn| Ok(cmd.query_async(conn).await))
            .await
    }
}

/// A command of `words`: its name, then its arguments.
fn command(words: &[&str]) -> redis::Cmd {
    let (name, args) = words.split_first().unwrap_or((&"PING", &[]));
    let mut cmd = redis::cmd(name);
    cmd.arg(args);
    cmd
}

fn text(value: &Value) -> String {
    match value {
        Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        Value::SimpleString(s) => s.clone(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The names of the commands `source` calls through `redis.call` and `redis.pcall` with a
    /// literal name.
    fn called(source: &str, out: &mut BTreeSet<String>) {
        for part in source.split("redis.").skip(1) {
            let Some(rest) = part
                .strip_prefix("call(")
                .or_else(|| part.strip_prefix("pcall("))
            else {
                continue;
            };
            let rest = rest.trim_start();
            let Some(quote) = rest.chars().next().filter(|c| *c == '\'' || *c == '"') else {
                continue;
            };
            if let Some(name) = rest[1..].split(quote).next() {
                out.insert(name.to_lowercase());
            }
        }
    }

    /// Every file of `dir` (recursively) whose name ends with `ext`.
    fn files(dir: &std::path::Path, ext: &str, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                files(&path, ext, out);
            } else if path.to_string_lossy().ends_with(ext) {
                out.push(path);
            }
        }
    }

    #[test]
    fn the_rules_grant_exactly_what_the_scripts_call() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut paths = Vec::new();
        files(&root.join("lua"), ".lua", &mut paths);
        files(&root.join("src"), ".rs", &mut paths);
        let mut used = BTreeSet::new();
        for path in paths {
            // The probe calls what the table tells it; this file names commands in its tests.
            if path.ends_with("acl_probe.lua") || path.ends_with("acl.rs") {
                continue;
            }
            let source = std::fs::read_to_string(&path).expect("a source file");
            called(&source, &mut used);
        }
        let listed: BTreeSet<String> = SCRIPTED.iter().map(|(c, _)| (*c).to_owned()).collect();
        assert!(used.len() > 20, "found too few calls to trust: {used:?}");
        assert_eq!(
            used, listed,
            "SCRIPTED must list exactly the commands the scripts call"
        );
    }

    #[test]
    fn the_rules_name_the_prefix_its_channel_and_every_command_once() {
        let rules = rules("acme");
        assert!(
            rules.starts_with("resetkeys ~acme:* resetchannels &acme:denials -@all +ping "),
            "{rules}"
        );
        let words: Vec<&str> = rules.split(' ').collect();
        for c in DIRECT
            .iter()
            .map(|(c, _)| c)
            .chain(SCRIPTED.iter().map(|(c, _)| c))
        {
            assert!(words.contains(&format!("+{c}").as_str()), "+{c} in {rules}");
        }
        let unique: BTreeSet<&str> = words.iter().copied().collect();
        assert_eq!(words.len(), unique.len(), "no rule twice: {rules}");
    }

    #[test]
    fn refusals_name_the_rule_they_lack() {
        let cases = [
            ("NOPERM this user has no permissions to run the 'evalsha' command", "x", "+evalsha"),
            (
                "NOPERM this user has no permissions to run the 'script|load' command",
                "x",
                "+script|load",
            ),
            (
                "ERR The user executing the script can't run this command or subcommand",
                "zpopmin",
                "+zpopmin",
            ),
            (
                "NOPERM this user has no permissions to access one of the keys used as arguments",
                "x",
                "~rl:*",
            ),
            (
                "NOPERM this user has no permissions to access one of the channels used as arguments",
                "x",
                "&rl:denials",
            ),
        ];
        for (message, command, rule) in cases {
            assert_eq!(
                missing_rule(message, command, "rl").as_deref(),
                Some(rule),
                "{message}"
            );
        }
        assert_eq!(
            missing_rule("WRONGTYPE Operation against a key", "get", "rl"),
            None
        );
        assert_eq!(missing_rule("OOM command not allowed", "set", "rl"), None);
    }
}
