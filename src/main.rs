//! The `ratelimiter` binary: read the settings, start logging (and traces), serve.

use std::io::Write;
use std::path::PathBuf;

use anyhow::bail;
use ratelimiter::api::health::{COMMIT, VERSION};
use ratelimiter::config::Settings;
use ratelimiter::limiter::{Op, MAX_LIMITS};
use ratelimiter::policy::Algorithm;
use ratelimiter::startup::Application;
use ratelimiter::store::redis::acl;
use ratelimiter::store::scripts;
use ratelimiter::{telemetry, trace};

// mimalloc: per-thread free lists make the many small allocations of a request (headers, JSON,
// spans) cheaper than glibc's malloc, which the profile of an acquire put at 12 % of its time.
// The `system-allocator` feature leaves the system's, whose calls valgrind can count
// (`bench/allocs.py`).
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "usage: ratelimiter [--config PATH]
       ratelimiter --print-script [OPERATION:]ALGORITHM[,ALGORITHM...] | --print-script batch
       ratelimiter [--config PATH] --print-acl
       ratelimiter -V | --version
       ratelimiter -h | --help

Serves the rate-limit API. Settings come from defaults, then the TOML file given by --config or
RATELIMITER_CONFIG, then RATELIMITER__<SECTION>__<KEY> environment variables. Without
redis.url it runs on the embedded in-process store.

  --config PATH     the TOML settings file
  --print-script    print the Lua source sent to Redis for an operation (acquire, peek, report
                    or refund; acquire when left out) on a policy's algorithms, or the batch
                    script, and exit
  --print-acl       print the Redis ACL rules of a user that may do all the service does under
                    the configured redis.key_prefix and nothing else, and exit
  -V, --version     print the release and the git commit of this binary, and exit
  -h, --help        print this text, and exit";

/// `ratelimiter <version> (commit <commit>)`: the same two values `/healthz` answers.
fn version_line() -> String {
    format!("ratelimiter {VERSION} (commit {COMMIT})")
}

/// Writes `text` to standard output and exits 0; a reader that went away (`ratelimiter --help |
/// head -1`) ends it quietly, where `print!` would panic on the broken pipe.
fn print_and_exit(text: &str) -> ! {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(text.as_bytes()).and_then(|()| out.flush());
    std::process::exit(0)
}

/// The settings file, and whether `--print-acl` was asked for (it needs the settings' prefix).
fn config_path() -> anyhow::Result<(Option<PathBuf>, bool)> {
    let mut args = std::env::args_os().skip(1);
    let mut path = std::env::var_os("RATELIMITER_CONFIG").map(PathBuf::from);
    let mut print_acl = false;
    while let Some(arg) = args.next() {
        match arg.to_str() {
            Some("--config") => match args.next() {
                Some(p) => path = Some(PathBuf::from(p)),
                None => bail!("--config needs a path\n\n{USAGE}"),
            },
            Some("-h" | "--help") => {
                print_and_exit(&format!("{USAGE}\n"));
            }
            Some("--print-script") => {
                // The exact source sent to Redis, for bench/run.py and for operators.
                let name = args
                    .next()
                    .and_then(|n| n.into_string().ok())
                    .unwrap_or_default();
                if name == "batch" {
                    print_and_exit(&scripts::batch_source(false));
                }
                // An operation (acquire when not named), then one algorithm, or several
                // separated by commas: a policy's limits in order.
                let (op, list) = match name.split_once(':') {
                    Some((op, list)) => (Op::ALL.into_iter().find(|o| o.as_str() == op), list),
                    None => (Some(Op::Acquire), name.as_str()),
                };
                let algorithms: Option<Vec<Algorithm>> =
                    list.split(',').map(Algorithm::parse).collect();
                match (op, algorithms) {
                    (Some(op), Some(a)) if (1..=MAX_LIMITS).contains(&a.len()) => {
                        print_and_exit(&scripts::compose(&a, op))
                    }
                    _ => bail!(
                        "--print-script takes [<operation>:]<algorithms>: acquire, peek, report or refund, then algorithm names separated by commas (at most {MAX_LIMITS}), or `batch`, not {name:?}"
                    ),
                }
            }
            Some("--print-acl") => print_acl = true,
            Some("-V" | "--version") => print_and_exit(&format!("{}\n", version_line())),
            _ => bail!("unexpected argument {arg:?}\n\n{USAGE}"),
        }
    }
    Ok((path, print_acl))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let (path, print_acl) = config_path()?;
    let settings = Settings::load(path.as_deref())?;
    if print_acl {
        print_and_exit(&format!("{}\n", acl::rules(&settings.redis.key_prefix)));
    }
    let (exporting, traces) = trace::start(&settings.tracing)?.unzip();
    telemetry::init(&settings.log, traces);
    tracing::info!(version = VERSION, commit = COMMIT, "ratelimiter starting");
    if let Some(e) = &exporting {
        e.announce();
    }
    let served = async {
        Application::build(settings)
            .await?
            .run_until_stopped()
            .await
            .map_err(anyhow::Error::from)
    }
    .await;
    if let Some(e) = exporting {
        // The provider's shutdown blocks until its batch thread has sent what is queued.
        tokio::task::spawn_blocking(move || e.shutdown()).await?;
    }
    served
}
