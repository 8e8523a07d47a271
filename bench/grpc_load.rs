//! The benchmark's gRPC load generator: Envoy's `ShouldRateLimit` calls
//! (`envoy.service.ratelimit.v3.RateLimitService`), a fixed number in flight over a fixed number
//! of HTTP/2 connections, for a fixed time after a warm-up. `bench/run.py` runs it beside `wrk`
//! on the same policies; it prints one JSON line on stdout.
//!
//!     cargo build --release --example grpc_load
//!     target/release/examples/grpc_load --target 127.0.0.1:8081 --concurrency 50 --duration 2
//!
//! Each call carries one descriptor per `--descriptor KEY` (default: one, `remote_address`), of
//! one entry `KEY`, whose value is drawn at random from `--keys N` values (`k1` … `kN`; with
//! `--keys 1` always `hot`), as `bench/wrk.lua` draws `POST /v1/acquire` keys: a policy serving
//! `KEY` decides the subject `POST /v1/acquire` names with the same key. Two `--descriptor`s
//! make every call decide two subjects together (all or nothing).
//!
//! Like `wrk` it is a closed loop (each of the `--concurrency` tasks sends its next call when
//! the last one is answered), so a stall delays the calls behind it instead of adding to the
//! latencies: the percentiles are those of the calls made, as `wrk`'s are. Counted are the
//! calls answered between the end of the warm-up and the end of the run; `slow` counts those
//! that took longer than `--slow-ms` (default 20, Envoy's default timeout for this service).
//! A call unanswered after `--timeout-ms` counts as an error (`timeout`); an answer in which a
//! descriptor was decided by no policy (no `current_limit`: a domain or key no policy serves)
//! counts as `unmatched`. It exits with 1 when the arguments are wrong, a connection cannot be
//! made, or no call got an answer.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_response::Code;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use hdrhistogram::Histogram;
use serde_json::json;
use tonic::transport::{Channel, Endpoint};

#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "\
usage: grpc_load --target HOST:PORT [options]
  --target ADDR         the rate-limit service, `host:port` or `http://host:port`
  --connections N       HTTP/2 connections (channels) the calls share (default 2)
  --concurrency N       calls in flight (default 50)
  --duration S          seconds measured, after the warm-up (default 2)
  --warmup S            seconds of calls not counted, first (default 0.5)
  --domain D            the calls' domain (default edge)
  --descriptor KEY      one descriptor of one entry KEY per call; repeat for several
                        (default: one, remote_address)
  --keys N              distinct values per descriptor: k1..kN, or `hot` for 1 (default 100000)
  --hits N              the request's hits_addend (default 0: Envoy's default, 1 unit)
  --threads N           the client's runtime threads (default 2, as bench/run.py's wrk -t)
  --slow-ms MS          calls slower than this are counted as slow (default 20)
  --timeout-ms MS       a call unanswered after this is an error (default 5000)";

/// What to send, and for how long.
#[derive(Debug, Clone)]
struct Plan {
    target: String,
    connections: usize,
    concurrency: usize,
    duration: Duration,
    warmup: Duration,
    domain: String,
    descriptors: Vec<String>,
    keys: u64,
    hits: u32,
    threads: usize,
    slow: Duration,
    timeout: Duration,
}

impl Plan {
    fn parse(mut args: impl Iterator<Item = String>) -> Result<Plan, String> {
        let mut plan = Plan {
            target: String::new(),
            connections: 2,
            concurrency: 50,
            duration: Duration::from_secs(2),
            warmup: Duration::from_millis(500),
            domain: "edge".to_owned(),
            descriptors: Vec::new(),
            keys: 100_000,
            hits: 0,
            threads: 2,
            slow: Duration::from_millis(20),
            timeout: Duration::from_secs(5),
        };
        while let Some(flag) = args.next() {
            if flag == "-h" || flag == "--help" {
                return Err(String::new());
            }
            let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
            match flag.as_str() {
                "--target" => plan.target = value()?,
                "--connections" => plan.connections = count(&flag, &value()?)?,
                "--concurrency" => plan.concurrency = count(&flag, &value()?)?,
                "--duration" => plan.duration = seconds(&flag, &value()?)?,
                "--warmup" => plan.warmup = seconds(&flag, &value()?)?,
                "--domain" => plan.domain = value()?,
                "--descriptor" => plan.descriptors.push(value()?),
                "--keys" => plan.keys = count(&flag, &value()?)? as u64,
                "--hits" => {
                    let v = value()?;
                    plan.hits = v
                        .parse()
                        .map_err(|_| format!("{flag} takes a whole number, not `{v}`"))?;
                }
                "--threads" => plan.threads = count(&flag, &value()?)?,
                "--slow-ms" => plan.slow = Duration::from_millis(count(&flag, &value()?)? as u64),
                "--timeout-ms" => {
                    plan.timeout = Duration::from_millis(count(&flag, &value()?)? as u64)
                }
                _ => return Err(format!("unknown argument `{flag}`")),
            }
        }
        if plan.target.is_empty() {
            return Err("--target is required".to_owned());
        }
        if !plan.target.contains("://") {
            plan.target = format!("http://{}", plan.target);
        }
        if plan.duration.is_zero() {
            return Err("--duration must be above 0".to_owned());
        }
        if plan.domain.is_empty() || plan.descriptors.iter().any(String::is_empty) {
            return Err("--domain and --descriptor must not be empty".to_owned());
        }
        if plan.descriptors.is_empty() {
            plan.descriptors.push("remote_address".to_owned());
        }
        Ok(plan)
    }

    /// One call's request, its values drawn with `rng`.
    fn request(&self, rng: &mut SplitMix) -> RateLimitRequest {
        let descriptors = self
            .descriptors
            .iter()
            .map(|key| RateLimitDescriptor {
                entries: vec![Entry {
                    key: key.clone(),
                    value: if self.keys == 1 {
                        "hot".to_owned()
                    } else {
                        format!("k{}", 1 + rng.next() % self.keys)
                    },
                }],
                ..RateLimitDescriptor::default()
            })
            .collect();
        RateLimitRequest {
            domain: self.domain.clone(),
            descriptors,
            hits_addend: self.hits,
        }
    }
}

/// A count of at least 1.
fn count(flag: &str, value: &str) -> Result<usize, String> {
    match value.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!(
            "{flag} takes a whole number above 0, not `{value}`"
        )),
    }
}

fn seconds(flag: &str, value: &str) -> Result<Duration, String> {
    value
        .parse::<f64>()
        .ok()
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| format!("{flag} takes seconds (0 or more), not `{value}`"))
}

/// An error and its causes, `: `-separated (tonic's transport error alone says only
/// "transport error"), each message once.
fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    let mut last = text.clone();
    while let Some(cause) = source {
        let said = cause.to_string();
        // hyper's and tonic's layers often repeat their inner error's message.
        if said != last {
            text.push_str(": ");
            text.push_str(&said);
        }
        last = said;
        source = cause.source();
    }
    text
}

/// A small, fast generator for the descriptor values (splitmix64): the values need to be
/// spread, not unpredictable.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// What one task, or all of them, saw in the measured window.
struct Tally {
    /// Every call answered or failed, in the window or not (warm-up and the last calls too):
    /// what a process's CPU time is divided by.
    all: u64,
    ok: u64,
    over_limit: u64,
    /// Answers whose overall code is neither `OK` nor `OVER_LIMIT`.
    unknown: u64,
    /// Answers in which a descriptor was decided by no policy (no `current_limit`): the domain or
    /// a descriptor key that no policy serves, which measures nothing but the call.
    unmatched: u64,
    /// Failed calls by gRPC status code (`timeout`: no answer within `--timeout-ms`).
    errors: BTreeMap<String, u64>,
    first_error: Option<String>,
    slow: u64,
    /// Microseconds per answered or failed call.
    latency_us: Histogram<u64>,
}

impl Tally {
    fn new() -> Result<Tally, String> {
        // 1 us to 1 hour, 3 significant digits.
        let latency_us = Histogram::new_with_bounds(1, 3_600_000_000, 3)
            .map_err(|e| format!("cannot make the latency histogram: {e}"))?;
        Ok(Tally {
            all: 0,
            ok: 0,
            over_limit: 0,
            unknown: 0,
            unmatched: 0,
            errors: BTreeMap::new(),
            first_error: None,
            slow: 0,
            latency_us,
        })
    }

    fn error(&mut self, code: String, message: String) {
        *self.errors.entry(code).or_default() += 1;
        self.first_error.get_or_insert(message);
    }

    fn merge(&mut self, other: Tally) -> Result<(), String> {
        self.all += other.all;
        self.ok += other.ok;
        self.over_limit += other.over_limit;
        self.unknown += other.unknown;
        self.unmatched += other.unmatched;
        for (code, n) in other.errors {
            *self.errors.entry(code).or_default() += n;
        }
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
        self.slow += other.slow;
        self.latency_us
            .add(&other.latency_us)
            .map_err(|e| format!("cannot merge latencies: {e}"))
    }

    fn calls(&self) -> u64 {
        self.latency_us.len()
    }
}

/// One of the `--concurrency` tasks: a call at a time until `end`, counting those answered
/// from `from` to `end`.
async fn caller(
    mut client: RateLimitServiceClient<Channel>,
    plan: Arc<Plan>,
    seed: u64,
    from: Instant,
    end: Instant,
) -> Result<Tally, String> {
    let mut tally = Tally::new()?;
    let mut rng = SplitMix(seed);
    while Instant::now() < end {
        let request = plan.request(&mut rng);
        let started = Instant::now();
        let answer = tokio::time::timeout(plan.timeout, client.should_rate_limit(request)).await;
        let done = Instant::now();
        tally.all += 1;
        if done < from || done > end {
            continue;
        }
        let took = done - started;
        tally
            .latency_us
            .saturating_record(u64::try_from(took.as_micros()).unwrap_or(u64::MAX));
        if took > plan.slow {
            tally.slow += 1;
        }
        match answer {
            Ok(Ok(r)) => {
                let r = r.get_ref();
                if r.statuses.len() != plan.descriptors.len()
                    || r.statuses.iter().any(|s| s.current_limit.is_none())
                {
                    tally.unmatched += 1;
                }
                match r.overall_code {
                    c if c == Code::Ok as i32 => tally.ok += 1,
                    c if c == Code::OverLimit as i32 => tally.over_limit += 1,
                    _ => tally.unknown += 1,
                }
            }
            Ok(Err(status)) => tally.error(
                format!("{:?}", status.code()),
                format!("{:?}: {}", status.code(), status.message()),
            ),
            Err(_) => tally.error(
                "timeout".to_owned(),
                format!("no answer within {} ms", plan.timeout.as_millis()),
            ),
        }
    }
    Ok(tally)
}

async fn run(plan: Plan) -> Result<serde_json::Value, String> {
    let endpoint = Endpoint::from_shared(plan.target.clone())
        .map_err(|e| format!("--target `{}`: {e}", plan.target))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5));
    // One HTTP/2 connection per channel: `Endpoint::connect` dials a new one each time.
    let mut channels = Vec::with_capacity(plan.connections);
    for _ in 0..plan.connections {
        let channel = endpoint
            .connect()
            .await
            .map_err(|e| format!("cannot connect to {}: {}", plan.target, causes(&e)))?;
        channels.push(channel);
    }
    let plan = Arc::new(plan);
    let began = Instant::now();
    let from = began + plan.warmup;
    let end = from + plan.duration;
    let seed = u64::from(std::process::id()) << 32;
    let tasks: Vec<_> = (0..plan.concurrency)
        .map(|i| {
            let client = RateLimitServiceClient::new(channels[i % channels.len()].clone());
            tokio::spawn(caller(client, plan.clone(), seed ^ i as u64, from, end))
        })
        .collect();
    let mut all = Tally::new()?;
    for task in tasks {
        let tally = task
            .await
            .map_err(|e| format!("a calling task failed: {e}"))??;
        all.merge(tally)?;
    }
    let seconds = plan.duration.as_secs_f64();
    let h = &all.latency_us;
    let calls = all.calls();
    Ok(json!({
        "calls": calls,
        "calls_total": all.all,
        "seconds": seconds,
        "calls_per_s": calls as f64 / seconds,
        "ok": all.ok,
        "over_limit": all.over_limit,
        "unknown": all.unknown,
        "unmatched": all.unmatched,
        "errors": all.errors.values().sum::<u64>(),
        "error_codes": all.errors,
        "first_error": all.first_error,
        "slow": all.slow,
        "slow_ms": plan.slow.as_millis() as u64,
        "latency_us": {
            "p50": h.value_at_quantile(0.5),
            "p90": h.value_at_quantile(0.9),
            "p99": h.value_at_quantile(0.99),
            "p999": h.value_at_quantile(0.999),
            "max": h.max(),
            "mean": h.mean(),
        },
        "settings": {
            "target": plan.target,
            "connections": plan.connections,
            "concurrency": plan.concurrency,
            "warmup_s": plan.warmup.as_secs_f64(),
            "domain": plan.domain,
            "descriptors": plan.descriptors,
            "keys": plan.keys,
            "hits_addend": plan.hits,
            "threads": plan.threads,
        },
    }))
}

fn main() -> ExitCode {
    let plan = match Plan::parse(std::env::args().skip(1)) {
        Ok(plan) => plan,
        Err(e) if e.is_empty() => {
            println!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("grpc_load: {e}\n{USAGE}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(plan.threads)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("grpc_load: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(plan)) {
        Ok(report) => {
            println!("{report}");
            let answered = report["ok"].as_u64().unwrap_or(0)
                + report["over_limit"].as_u64().unwrap_or(0)
                + report["unknown"].as_u64().unwrap_or(0);
            if answered == 0 {
                let why = report["first_error"].as_str().unwrap_or("no call was made");
                eprintln!("grpc_load: no call got an answer: {why}");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("grpc_load: {e}");
            ExitCode::FAILURE
        }
    }
}
