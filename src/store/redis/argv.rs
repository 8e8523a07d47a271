//! The calling convention of `lua/common.lua`, shared by every decision script: the ARGV a
//! decision is sent with ([`script_argv`]) and the reply it answers ([`verdict`]), read alike by
//! the direct call ([`super::RedisStore`]'s `decide`) and by the batcher ([`super::batch`]), and a
//! reservation's ([`reservation`]); and
//! how a script that writes nothing is called ([`read_only`]), with its arguments ([`Arg`]).

use redis::Value;

use super::connection::Conn;
use crate::limiter::{Decision, Mark, Op, Params, Verdict, MAX_LIMITS};
use crate::store::StoreError;

/// A decision script's reply (see `lua/common.lua`: `{allowed, then per limit: units,
/// remaining, reset_after_us, retry_after_us; then now; then, for an acquire or a report, per
/// limit its refund count; then, for a decision moved to the subject's queue, its time}`) as a
/// verdict: for a report or a refund each limit's units are
/// those it recorded or gave back, and the limit counts as admitting. Read straight from the
/// reply, without collecting it into a second vector on the acquire path.
pub(super) fn verdict(reply: &Value, limits: usize, op: Op) -> Result<Verdict, StoreError> {
    let counted = counts_refunds(op);
    let len = 2 + 4 * limits + if counted { limits } else { 0 };
    // One number more: the decision was moved to the subject's queue, and that is its time.
    let items = match reply {
        Value::Array(items) if items.len() == len || items.len() == len + 1 => items,
        other => {
            return Err(StoreError::corrupt(format!(
                "a decision script answered {other:?} for {limits} limits"
            )))
        }
    };
    let mut numbers = [0u64; 3 + 5 * MAX_LIMITS];
    for (n, item) in numbers.iter_mut().zip(items) {
        *n = match item {
            Value::Int(i) => u64::try_from(*i).unwrap_or(0),
            other => {
                return Err(StoreError::corrupt(format!(
                    "a decision script answered {other:?} where a number belongs"
                )))
            }
        };
    }
    let mut verdict = Verdict::at(numbers[1 + 4 * limits]);
    let moves = matches!(op, Op::Report | Op::Refund);
    for d in numbers[1..1 + 4 * limits].chunks_exact(4) {
        let decision = Decision {
            allowed: moves || d[0] == 1,
            remaining: d[1],
            reset_after_us: d[2],
            retry_after_us: d[3],
        };
        verdict.push_units(decision, if moves { d[0] } else { 0 });
    }
    if items.len() > len {
        verdict.taken_us = numbers[len];
    }
    // The script's own verdict; it equals every limit admitting.
    verdict.allowed = numbers[0] == 1;
    if counted && verdict.allowed {
        let counts = &numbers[2 + 4 * limits..len];
        verdict.refunded[..limits].copy_from_slice(counts);
    }
    Ok(verdict)
}

/// A reservation script's reply (`lua/reserve.lua`: an acquire's, then the delay and the queue
/// left) as a verdict whose `taken_us` is the booked time.
pub(super) fn reservation(reply: &Value, limits: usize) -> Result<Verdict, StoreError> {
    let (head, delay) = match reply {
        Value::Array(items) if items.len() >= 2 => {
            let (head, tail) = items.split_at(items.len() - 2);
            (head, &tail[0])
        }
        other => {
            return Err(StoreError::corrupt(format!(
                "a reservation script answered {other:?} for {limits} limits"
            )))
        }
    };
    let Value::Int(delay) = delay else {
        return Err(StoreError::corrupt(format!(
            "a reservation script answered {delay:?} where its delay belongs"
        )));
    };
    let mut verdict = verdict(&Value::Array(head.to_vec()), limits, Op::Acquire)?;
    verdict.taken_us = verdict
        .at_us
        .saturating_add(u64::try_from(*delay).unwrap_or(0));
    Ok(verdict)
}

/// Whether `op`'s reply ends with each limit's refund count: an acquire's and a report's, whose
/// tickets keep it ([`Verdict::marks`]).
pub(super) const fn counts_refunds(op: Op) -> bool {
    matches!(op, Op::Acquire | Op::Report)
}

/// A decision script's ARGV as `lua/common.lua` lays it out for these limits; `None` is an empty
/// argument.
pub(super) fn script_argv<'a>(
    params: &'a [Params],
    op: Op,
    cost: u64,
    marks: &'a [Mark],
    now_us: Option<u64>,
) -> impl Iterator<Item = Option<u64>> + 'a {
    let n = params.len();
    let params = params.iter().flat_map(|p| p.script_args()).map(Some);
    // A refund's marks: per limit its time, then per limit its refund count, then the take's
    // time; all empty without a ticket.
    let marks = (marks.len() == n).then_some(marks);
    let field = move |f: fn(&Mark) -> u64| (0..n).map(move |i| marks.map(|m| f(&m[i])));
    let taken = marks.and_then(|m| m.first()).map(|m| m.taken_us);
    let marks = (op == Op::Refund)
        .then(|| {
            field(|m| m.at)
                .chain(field(|m| m.refunded))
                .chain(std::iter::once(taken))
        })
        .into_iter()
        .flatten();
    [Some(cost), now_us].into_iter().chain(params).chain(marks)
}

/// Runs `script` (with `EVALSHA`, loading it when Redis does not have it) on `keys`, with the
/// ARGV `argv` (`None`: an empty argument).
pub(super) async fn invoke<'k>(
    script: &redis::Script,
    keys: impl Iterator<Item = &'k str>,
    argv: impl Iterator<Item = Option<u64>>,
    conn: &mut Conn,
) -> redis::RedisResult<Value> {
    let mut call = script.prepare_invoke();
    for key in keys {
        call.key(key);
    }
    for arg in argv {
        match arg {
            Some(v) => call.arg(v),
            None => call.arg(""),
        };
    }
    call.invoke_async(conn).await
}

/// Runs a prepared call of a `no-writes` script with `EVALSHA_RO`, which Redis refuses for any
/// script that could write, loading the script first when Redis does not have it (as
/// `invoke_async` does for `EVALSHA`).
pub(super) async fn read_only(
    script: &redis::Script,
    keys: &[String],
    argv: impl Iterator<Item = impl redis::ToRedisArgs>,
    conn: &mut Conn,
) -> redis::RedisResult<Value> {
    let mut cmd = redis::cmd("EVALSHA_RO");
    cmd.arg(script.get_hash()).arg(keys.len()).arg(keys);
    for arg in argv {
        cmd.arg(arg);
    }
    match cmd.query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.load_async(conn).await?;
            cmd.query_async(conn).await
        }
        other => other,
    }
}

/// One script argument: a number, a string, or (for `None`) the empty string.
pub(super) enum Arg<'a> {
    Num(Option<u64>),
    Str(&'a str),
}

impl From<Option<u64>> for Arg<'_> {
    fn from(n: Option<u64>) -> Self {
        Arg::Num(n)
    }
}

impl redis::ToRedisArgs for Arg<'_> {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        match self {
            Arg::Num(Some(n)) => n.write_redis_args(out),
            Arg::Num(None) => out.write_arg(b""),
            Arg::Str(s) => s.write_redis_args(out),
        }
    }
}
