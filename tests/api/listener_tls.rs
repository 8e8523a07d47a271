//! TLS on the listeners: HTTPS and gRPC over TLS with certificates of `certs` (rcgen), client
//! certificates required by a client CA, certificate files replaced while the service runs
//! (picked up by the poll and by SIGHUP, an established connection kept), a bad file at start,
//! the expiry gauge and a silent TLS client against the handshake deadlines.

use std::time::{Duration, Instant};

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::rate_limit_service_client::RateLimitServiceClient;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};

use crate::certs::{Leaf, TestPki, Validity};
use crate::helpers::{spawn_app_with, Binary, TestApp};

/// A certificate of `pki` for `localhost` named `cn`, valid for `days`.
fn localhost(pki: &TestPki, cn: &str, days: u64) -> Leaf {
    pki.leaf(cn, &["localhost"], Validity::Days(days))
}

fn port(app: &TestApp) -> u16 {
    app.address.rsplit(':').next().unwrap().parse().unwrap()
}

/// An HTTPS client trusting `ca`, presenting `identity` if any.
fn https_client(ca: &str, identity: Option<&Leaf>) -> reqwest::Client {
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(reqwest::Certificate::from_pem(ca.as_bytes()).unwrap())
        .timeout(Duration::from_secs(5));
    if let Some(leaf) = identity {
        let pem = format!("{}{}", leaf.cert, leaf.key);
        builder = builder.identity(reqwest::Identity::from_pem(pem.as_bytes()).unwrap());
    }
    builder.build().unwrap()
}

async fn grpc_client(
    port: u16,
    ca: &str,
    identity: Option<&Leaf>,
) -> Result<RateLimitServiceClient<Channel>, tonic::transport::Error> {
    let mut tls = ClientTlsConfig::new()
        .ca_certificate(Certificate::from_pem(ca))
        .domain_name("localhost");
    if let Some(leaf) = identity {
        tls = tls.identity(Identity::from_pem(&leaf.cert, &leaf.key));
    }
    let channel = Channel::from_shared(format!("https://localhost:{port}"))
        .unwrap()
        .tls_config(tls)?
        .connect_timeout(Duration::from_secs(5))
        .connect()
        .await?;
    Ok(RateLimitServiceClient::new(channel))
}

fn request() -> RateLimitRequest {
    RateLimitRequest {
        domain: "tls".to_owned(),
        descriptors: vec![RateLimitDescriptor {
            entries: vec![Entry {
                key: "k".to_owned(),
                value: "v".to_owned(),
            }],
            ..RateLimitDescriptor::default()
        }],
        hits_addend: 0,
    }
}

async fn answers(client: &mut RateLimitServiceClient<Channel>) -> bool {
    client.should_rate_limit(request()).await.is_ok()
}

async fn healthz(client: &reqwest::Client, port: u16) -> reqwest::Result<reqwest::StatusCode> {
    client
        .get(format!("https://localhost:{port}/healthz"))
        .send()
        .await
        .map(|r| r.status())
}

#[tokio::test]
async fn https_and_grpc_over_tls_answer_with_the_test_certificate() {
    let pki = TestPki::new();
    let (cert, key) = pki.write("server", &localhost(&pki, "first", 365));
    let app = spawn_app_with(
        None,
        &[
            ("RATELIMITER__SERVER__TLS_CERT_FILE", &cert),
            ("RATELIMITER__SERVER__TLS_KEY_FILE", &key),
            ("RATELIMITER__GRPC__BIND", "127.0.0.1:0"),
            ("RATELIMITER__GRPC__TLS_CERT_FILE", &cert),
            ("RATELIMITER__GRPC__TLS_KEY_FILE", &key),
        ],
    )
    .await;
    let http = https_client(pki.ca_pem(), None);
    assert_eq!(healthz(&http, port(&app)).await.unwrap(), 200);
    // Plain HTTP on the HTTPS port gets no answer.
    assert!(
        reqwest::get(format!("http://127.0.0.1:{}/healthz", port(&app)))
            .await
            .map_or(true, |r| r.status() != 200)
    );
    let mut grpc = grpc_client(app.grpc_port.unwrap(), pki.ca_pem(), None)
        .await
        .expect("gRPC over TLS connects");
    assert!(answers(&mut grpc).await, "ShouldRateLimit over TLS answers");
    // A client trusting another CA is refused the handshake.
    let other = TestPki::new();
    assert!(healthz(&https_client(other.ca_pem(), None), port(&app))
        .await
        .is_err());
}

#[tokio::test]
async fn with_a_client_ca_a_client_without_a_certificate_is_refused_on_both_listeners() {
    let pki = TestPki::new();
    let (cert, key) = pki.write("server", &localhost(&pki, "server", 365));
    let ca = pki.ca_file().to_owned();
    let app = spawn_app_with(
        None,
        &[
            ("RATELIMITER__SERVER__TLS_CERT_FILE", &cert),
            ("RATELIMITER__SERVER__TLS_KEY_FILE", &key),
            ("RATELIMITER__SERVER__TLS_CLIENT_CA_FILE", &ca),
            ("RATELIMITER__GRPC__BIND", "127.0.0.1:0"),
            ("RATELIMITER__GRPC__TLS_CERT_FILE", &cert),
            ("RATELIMITER__GRPC__TLS_KEY_FILE", &key),
            ("RATELIMITER__GRPC__TLS_CLIENT_CA_FILE", &ca),
        ],
    )
    .await;
    let client_leaf = localhost(&pki, "envoy", 365);
    // Signed by another CA: refused as well.
    let stranger = localhost(&TestPki::new(), "stranger", 365);

    assert!(healthz(&https_client(pki.ca_pem(), None), port(&app))
        .await
        .is_err());
    assert!(
        healthz(&https_client(pki.ca_pem(), Some(&stranger)), port(&app))
            .await
            .is_err()
    );
    assert_eq!(
        healthz(&https_client(pki.ca_pem(), Some(&client_leaf)), port(&app))
            .await
            .unwrap(),
        200
    );

    let grpc_port = app.grpc_port.unwrap();
    // In TLS 1.3 the refusal may come after the client's handshake is done: at the first call.
    let refused = match grpc_client(grpc_port, pki.ca_pem(), None).await {
        Err(_) => true,
        Ok(mut c) => !answers(&mut c).await,
    };
    assert!(refused, "a gRPC client without a certificate is refused");
    let refused = match grpc_client(grpc_port, pki.ca_pem(), Some(&stranger)).await {
        Err(_) => true,
        Ok(mut c) => !answers(&mut c).await,
    };
    assert!(
        refused,
        "a gRPC client with a stranger's certificate is refused"
    );
    let mut ok = grpc_client(grpc_port, pki.ca_pem(), Some(&client_leaf))
        .await
        .expect("a client with a certificate connects");
    assert!(answers(&mut ok).await);
}

/// Replaces the server's files with a certificate of a second CA, then waits until a new
/// connection trusting only that CA is served, checking that connections opened before the
/// change (trusting only the first CA) keep answering.
async fn replaced_files_are_picked_up(by_signal: bool) {
    let first = TestPki::new();
    let (cert, key) = first.write("server", &localhost(&first, "first", 365));
    let app = spawn_app_with(
        None,
        &[
            ("RATELIMITER__SERVER__TLS_CERT_FILE", &cert),
            ("RATELIMITER__SERVER__TLS_KEY_FILE", &key),
            ("RATELIMITER__SERVER__KEEP_ALIVE_S", "600"),
            ("RATELIMITER__GRPC__BIND", "127.0.0.1:0"),
            ("RATELIMITER__GRPC__TLS_CERT_FILE", &cert),
            ("RATELIMITER__GRPC__TLS_KEY_FILE", &key),
        ],
    )
    .await;
    let old_http = https_client(first.ca_pem(), None);
    assert_eq!(healthz(&old_http, port(&app)).await.unwrap(), 200);
    let mut old_grpc = grpc_client(app.grpc_port.unwrap(), first.ca_pem(), None)
        .await
        .unwrap();
    assert!(answers(&mut old_grpc).await);

    let second = TestPki::new();
    let before = std::fs::metadata(&cert).unwrap();
    let mut new = localhost(&second, "secnd", 365);
    if by_signal {
        // The same sizes and modification times as before, so that only SIGHUP can tell.
        let key_len = std::fs::metadata(&key).unwrap().len() as usize;
        while new.cert.len() != before.len() as usize || new.key.len() != key_len {
            new = localhost(&second, "secnd", 365);
        }
    }
    let modified = before.modified().unwrap();
    let key_modified = std::fs::metadata(&key).unwrap().modified().unwrap();
    std::fs::write(&cert, &new.cert).unwrap();
    std::fs::write(&key, &new.key).unwrap();
    if by_signal {
        for (path, at) in [(&cert, modified), (&key, key_modified)] {
            std::fs::File::options()
                .write(true)
                .open(path)
                .unwrap()
                .set_modified(at)
                .unwrap();
        }
        // The poll sees nothing: after three of its rounds the old certificate is still served.
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(
            healthz(&https_client(first.ca_pem(), None), port(&app))
                .await
                .unwrap(),
            200,
            "without SIGHUP, unchanged stamps keep the certificate"
        );
        // To this process, where the service runs and has installed its SIGHUP handler.
        crate::helpers::signal_pid(std::process::id(), "HUP");
    }
    let start = Instant::now();
    loop {
        let http = healthz(&https_client(second.ca_pem(), None), port(&app)).await;
        let grpc = match grpc_client(app.grpc_port.unwrap(), second.ca_pem(), None).await {
            Ok(mut c) => answers(&mut c).await,
            Err(_) => false,
        };
        if http.is_ok() && grpc {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the new certificate was not picked up"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // New connections trusting the first CA alone are refused now...
    assert!(healthz(&https_client(first.ca_pem(), None), port(&app))
        .await
        .is_err());
    // ...so the old clients answering proves their connections were kept.
    assert_eq!(healthz(&old_http, port(&app)).await.unwrap(), 200);
    assert!(answers(&mut old_grpc).await);
}

#[tokio::test]
async fn replaced_certificate_files_are_picked_up_by_the_poll_and_connections_are_kept() {
    replaced_files_are_picked_up(false).await;
}

#[tokio::test]
async fn replaced_certificate_files_are_picked_up_on_sighup_and_connections_are_kept() {
    replaced_files_are_picked_up(true).await;
}

#[tokio::test]
async fn a_bad_file_at_start_fails_naming_the_setting() {
    let pki = TestPki::new();
    let (cert, key) = pki.write("server", &localhost(&pki, "server", 365));
    let garbage = pki.path("garbage.pem");
    std::fs::write(&garbage, "not a pem file").unwrap();
    let other_key = pki.path("other.key");
    std::fs::write(&other_key, localhost(&pki, "other", 1).key).unwrap();
    for (env, named) in [
        (
            vec![
                ("RATELIMITER__SERVER__TLS_CERT_FILE", garbage.as_str()),
                ("RATELIMITER__SERVER__TLS_KEY_FILE", key.as_str()),
            ],
            "server.tls_cert_file",
        ),
        (
            vec![
                ("RATELIMITER__SERVER__TLS_CERT_FILE", cert.as_str()),
                ("RATELIMITER__SERVER__TLS_KEY_FILE", other_key.as_str()),
            ],
            "server.tls_key_file",
        ),
        (
            vec![
                ("RATELIMITER__GRPC__BIND", "127.0.0.1:0"),
                ("RATELIMITER__GRPC__TLS_CERT_FILE", cert.as_str()),
                ("RATELIMITER__GRPC__TLS_KEY_FILE", "/nonexistent/key.pem"),
            ],
            "grpc.tls_key_file",
        ),
        (
            vec![
                ("RATELIMITER__GRPC__BIND", "127.0.0.1:0"),
                ("RATELIMITER__GRPC__TLS_CERT_FILE", cert.as_str()),
                ("RATELIMITER__GRPC__TLS_KEY_FILE", key.as_str()),
                ("RATELIMITER__GRPC__TLS_CLIENT_CA_FILE", garbage.as_str()),
            ],
            "grpc.tls_client_ca_file",
        ),
    ] {
        let mut all = vec![(
            "RATELIMITER__SERVER__BIND".to_owned(),
            "127.0.0.1:0".to_owned(),
        )];
        all.extend(env.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        let settings = ratelimiter::config::Settings::load_from(None, all).expect("valid settings");
        let error = match ratelimiter::startup::Application::build(settings).await {
            Ok(_) => panic!("started with a bad {named}"),
            Err(e) => format!("{e:#}"),
        };
        assert!(error.contains(named), "{error} names {named}");
    }
    // A certificate without its key is a configuration error naming the key.
    let error = ratelimiter::config::Settings::load_from(
        None,
        vec![(
            "RATELIMITER__GRPC__TLS_CERT_FILE".to_owned(),
            cert.to_owned(),
        )],
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("grpc.tls_key_file"), "{error}");
}

#[tokio::test]
async fn the_expiry_gauge_shows_the_days_left() {
    let pki = TestPki::new();
    let (cert, key) = pki.write("server", &localhost(&pki, "soon", 20));
    let binary = Binary::start(
        "",
        &[
            ("RATELIMITER__GRPC__BIND", "127.0.0.1:0"),
            ("RATELIMITER__GRPC__TLS_CERT_FILE", &cert),
            ("RATELIMITER__GRPC__TLS_KEY_FILE", &key),
        ],
    )
    .await;
    let text = reqwest::get(format!("{}/metrics", binary.address))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let line = text
        .lines()
        .find(|l| l.starts_with("ratelimiter_tls_certificate_expiry_days{certificate=\"grpc\"}"))
        .unwrap_or_else(|| panic!("no expiry gauge in {text}"));
    let days: f64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((19.9..=20.0).contains(&days), "{line}");
    // 20 days left: /readyz says nothing of it.
    let ready: serde_json::Value = reqwest::get(format!("{}/readyz", binary.address))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(ready.get("degraded").is_none(), "{ready}");
}

#[tokio::test]
async fn readyz_warns_of_a_certificate_near_its_expiry_and_stays_ready() {
    let pki = TestPki::new();
    let (cert, key) = pki.write("server", &localhost(&pki, "soon", 5));
    let app = spawn_app_with(
        None,
        &[
            ("RATELIMITER__GRPC__BIND", "127.0.0.1:0"),
            ("RATELIMITER__GRPC__TLS_CERT_FILE", &cert),
            ("RATELIMITER__GRPC__TLS_KEY_FILE", &key),
        ],
    )
    .await;
    let response = app.get("/readyz").await;
    assert_eq!(response.status(), 200);
    let ready: serde_json::Value = response.json().await.unwrap();
    let degraded = ready["degraded"].as_str().unwrap_or_default();
    assert!(
        degraded.contains("the grpc listener's TLS certificate expires in 5.0 days")
            || degraded.contains("the grpc listener's TLS certificate expires in 4.9 days"),
        "{ready}"
    );
}

#[tokio::test]
async fn silent_tls_clients_do_not_keep_out_a_client_that_speaks() {
    let pki = TestPki::new();
    let (cert, key) = pki.write("server", &localhost(&pki, "server", 365));
    let app = spawn_app_with(
        None,
        &[
            ("RATELIMITER__SERVER__TLS_CERT_FILE", &cert),
            ("RATELIMITER__SERVER__TLS_KEY_FILE", &key),
            ("RATELIMITER__SERVER__MAX_CONNECTIONS", "2"),
            ("RATELIMITER__SERVER__CLIENT_REQUEST_TIMEOUT_MS", "500"),
            ("RATELIMITER__GRPC__BIND", "127.0.0.1:0"),
            ("RATELIMITER__GRPC__TLS_CERT_FILE", &cert),
            ("RATELIMITER__GRPC__TLS_KEY_FILE", &key),
            ("RATELIMITER__GRPC__MAX_CONNECTIONS", "2"),
            ("RATELIMITER__GRPC__HANDSHAKE_TIMEOUT_MS", "500"),
        ],
    )
    .await;
    // More connections that never start their TLS handshake than either listener's cap.
    let mut silent = Vec::new();
    for p in [port(&app), app.grpc_port.unwrap()] {
        for _ in 0..6 {
            silent.push(
                tokio::net::TcpStream::connect(("127.0.0.1", p))
                    .await
                    .unwrap(),
            );
        }
    }
    let start = Instant::now();
    assert_eq!(
        healthz(&https_client(pki.ca_pem(), None), port(&app))
            .await
            .unwrap(),
        200
    );
    let mut grpc = grpc_client(app.grpc_port.unwrap(), pki.ca_pem(), None)
        .await
        .expect("a gRPC client that speaks connects");
    assert!(answers(&mut grpc).await);
    assert!(
        // Within the 500 ms deadlines and some slack: actix-web's own TLS handshake timeout
        // is 3 s.
        start.elapsed() < Duration::from_millis(2_500),
        "{:?}",
        start.elapsed()
    );
    drop(silent);
}

#[tokio::test]
async fn a_reload_that_fails_keeps_the_certificate_in_use_and_is_counted() {
    let pki = TestPki::new();
    let (cert, key) = pki.write("server", &localhost(&pki, "kept", 30));
    let grpc_port = crate::helpers::free_port();
    let bind = format!("127.0.0.1:{grpc_port}");
    let binary = Binary::start(
        "",
        &[
            ("RATELIMITER__GRPC__BIND", &bind),
            ("RATELIMITER__GRPC__TLS_CERT_FILE", &cert),
            ("RATELIMITER__GRPC__TLS_KEY_FILE", &key),
        ],
    )
    .await;
    std::fs::write(&cert, "not a certificate").unwrap();
    let failures = || async {
        let text = reqwest::get(format!("{}/metrics", binary.address))
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        text.lines()
            .find(|l| l.starts_with("ratelimiter_tls_reload_failures_total{listener=\"grpc\"}"))
            .and_then(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    let start = Instant::now();
    while failures().await < 1.0 {
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the failed reload was not counted: {}",
            binary.log_text()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        binary.log_text().contains("grpc.tls_cert_file"),
        "the error names the setting: {}",
        binary.log_text()
    );
    // The certificate loaded at start is still served to new connections.
    let mut client = grpc_client(grpc_port, pki.ca_pem(), None)
        .await
        .expect("the kept certificate is served");
    assert!(answers(&mut client).await);
}
