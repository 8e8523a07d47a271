//! Which build answers: `ratelimiter --version` and `/healthz` report the release (Cargo.toml's
//! `version`) and the git commit the binary was built from; CHANGELOG.md has a section for that
//! release, the newest one it lists.

use std::process::Command;

use serde_json::{json, Value};

use crate::helpers::{spawn_app, Backend, Binary};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const CHANGELOG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/CHANGELOG.md");
/// Keep a Changelog's kinds of change, the only `###` headings under a release.
const KINDS: [&str; 6] = [
    "Added",
    "Changed",
    "Deprecated",
    "Removed",
    "Fixed",
    "Security",
];

/// The commit the binary must report, found independently of `build.rs`: the
/// `RATELIMITER_COMMIT` it was given, else what `git rev-parse HEAD` says of this checkout, else
/// `unknown` when the sources are not a git checkout (an unpacked archive).
fn expected_commit() -> String {
    if let Some(c) = std::env::var("RATELIMITER_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty())
    {
        return c.trim().to_owned();
    }
    let dir = env!("CARGO_MANIFEST_DIR");
    if !std::path::Path::new(dir).join(".git").exists() {
        return "unknown".to_owned();
    }
    let out = Command::new("git")
        .args(["-C", dir, "rev-parse", "HEAD"])
        .output()
        .expect("git is needed to check the reported commit: apt-get install -y git");
    assert!(out.status.success(), "git rev-parse HEAD: {out:?}");
    String::from_utf8(out.stdout)
        .expect("UTF-8")
        .trim()
        .to_owned()
}

fn run(arg: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_ratelimiter"))
        .arg(arg)
        .output()
        .expect("run the binary");
    assert!(out.status.success(), "{arg}: {out:?}");
    String::from_utf8(out.stdout).expect("UTF-8")
}

#[test]
fn version_flag_prints_the_release_and_the_commit() {
    let commit = expected_commit();
    let expected = format!("ratelimiter {VERSION} (commit {commit})\n");
    assert_eq!(run("--version"), expected);
    assert_eq!(run("-V"), expected);
    assert!(
        commit == "unknown"
            || (commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit())),
        "a full commit id: {commit}"
    );
}

#[test]
fn help_names_the_version_flag() {
    let help = run("--help");
    assert!(help.contains("-V, --version"), "{help}");
}

#[tokio::test]
async fn healthz_reports_the_version_and_commit() {
    let app = spawn_app(Backend::Embedded).await;
    let r = app.get("/healthz").await;
    assert_eq!(r.status(), 200);
    let body: Value = r.json().await.expect("JSON");
    assert_eq!(
        body,
        json!({"status": "ok", "version": VERSION, "commit": expected_commit(), "store": "embedded"})
    );
    let ready: Value = app.get("/readyz").await.json().await.expect("JSON");
    assert_eq!(ready["version"], VERSION, "{ready}");
    assert_eq!(ready["commit"], expected_commit(), "{ready}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_running_binary_reports_what_its_version_flag_prints() {
    let printed = run("--version");
    let binary = Binary::start("", &[]).await;
    let health: Value = reqwest::get(format!("{}/healthz", binary.address))
        .await
        .expect("sent")
        .json()
        .await
        .expect("JSON");
    let answered = format!(
        "ratelimiter {} (commit {})\n",
        health["version"].as_str().expect("version"),
        health["commit"].as_str().expect("commit")
    );
    assert_eq!(answered, printed);
    let log = binary.log_text();
    assert!(
        log.contains("ratelimiter starting") && log.contains(&expected_commit()),
        "the start-up line names the build: {log}"
    );
}

/// The release headings of CHANGELOG.md, newest first: `## [X.Y.Z] - YYYY-MM-DD`.
fn releases(changelog: &str) -> Vec<(Vec<u64>, String)> {
    changelog
        .lines()
        .filter_map(|l| l.strip_prefix("## ["))
        .filter(|l| !l.starts_with("Unreleased]"))
        .map(|l| {
            let (version, date) = l
                .split_once("] - ")
                .unwrap_or_else(|| panic!("a release heading is `## [X.Y.Z] - YYYY-MM-DD`: {l}"));
            let parts: Vec<u64> = version
                .split('.')
                .map(|p| p.parse().unwrap_or_else(|_| panic!("semver: {version}")))
                .collect();
            assert_eq!(parts.len(), 3, "semver: {version}");
            assert!(
                date.len() == 10 && date.parse::<jiff::civil::Date>().is_ok(),
                "a date: {l}"
            );
            (parts, version.to_owned())
        })
        .collect()
}

#[test]
fn the_changelog_has_a_section_for_this_version_and_it_is_the_newest() {
    let changelog = std::fs::read_to_string(CHANGELOG).expect("CHANGELOG.md");
    assert!(
        changelog.starts_with("# Changelog\n"),
        "Keep a Changelog form"
    );
    assert!(
        changelog.contains("\n## [Unreleased]\n"),
        "an Unreleased section collects changes until the next release"
    );
    let releases = releases(&changelog);
    assert_eq!(
        releases.first().map(|r| r.1.as_str()),
        Some(VERSION),
        "Cargo.toml's version {VERSION} must be the newest release in CHANGELOG.md: \
         move Unreleased into a `## [{VERSION}] - <date>` section when bumping it"
    );
    for pair in releases.windows(2) {
        assert!(
            pair[0].0 > pair[1].0,
            "newest first: {} before {}",
            pair[0].1,
            pair[1].1
        );
    }
    for l in changelog.lines().filter(|l| l.starts_with("### ")) {
        assert!(KINDS.contains(&&l[4..]), "an unknown kind of change: {l}");
    }
}

/// A reader that stops early (`ratelimiter --print-script … | head -1`) ends the printing
/// quietly: exit status 0, no panic about a broken pipe.
#[test]
fn printing_to_a_reader_that_went_away_exits_quietly() {
    for args in [&["--print-script", "token_bucket,gcra"][..], &["--help"]] {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ratelimiter"))
            .args(args)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("start the binary");
        // Close the reading end before the binary writes: every write is a broken pipe.
        drop(child.stdout.take());
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {:?} {stderr}", out.status);
        assert!(!stderr.contains("panicked"), "{args:?}: {stderr}");
    }
}
