//! The committed `openapi/openapi.json` is the spec the service serves, and `/docs/` serves the
//! Swagger UI from the binary.

use serde_json::Value;

use crate::helpers::{spawn_app, Backend};

const COMMITTED: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");

#[tokio::test]
async fn committed_openapi_matches_the_served_spec() {
    let app = spawn_app(Backend::Embedded).await;
    let served: Value = app
        .get("/openapi.json")
        .await
        .json()
        .await
        .expect("JSON spec");
    let pretty = serde_json::to_string_pretty(&served).expect("serializes") + "\n";
    if std::env::var_os("RATELIMITER_UPDATE_OPENAPI").is_some() {
        std::fs::write(COMMITTED, &pretty).expect("write openapi/openapi.json");
    }
    let committed = std::fs::read_to_string(COMMITTED).unwrap_or_default();
    assert!(
        committed == pretty,
        "openapi/openapi.json differs from the served spec; regenerate it with \
         `RATELIMITER_UPDATE_OPENAPI=1 cargo test openapi` and commit it"
    );
    assert!(served["openapi"]
        .as_str()
        .is_some_and(|v| v.starts_with("3.1")));
    for path in [
        "/v1/acquire",
        "/v1/leases",
        "/v1/leases/{id}",
        "/v1/leases/{id}/renew",
        "/v1/policies",
        "/v1/policies/{name}",
        "/healthz",
        "/readyz",
    ] {
        assert!(served["paths"].get(path).is_some(), "{path} is documented");
    }
}

#[tokio::test]
async fn swagger_ui_is_served_from_the_binary() {
    let app = spawn_app(Backend::Embedded).await;
    let r = app.get("/docs/").await;
    assert_eq!(r.status(), 200);
    let html = r.text().await.expect("HTML");
    assert!(html.contains("swagger-ui"), "{html}");
    assert!(
        !html.contains("https://"),
        "the UI must load nothing from the network"
    );
    let r = app.get("/docs/swagger-ui-bundle.js").await;
    assert_eq!(r.status(), 200, "the UI's script is vendored");
    let r = app.get("/docs/swagger-initializer.js").await;
    let js = r.text().await.expect("JS");
    assert!(js.contains("/openapi.json"), "{js}");
    // Without the slash, browsers are sent to the UI.
    let no_redirects = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .expect("client");
    let r = no_redirects
        .get(app.url("/docs"))
        .send()
        .await
        .expect("sent");
    assert!(r.status().is_redirection());
    assert_eq!(
        r.headers().get("location").and_then(|v| v.to_str().ok()),
        Some("/docs/")
    );
}
