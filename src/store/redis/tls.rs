//! TLS to Redis (`rediss://`): the one rustls client configuration every connection of the
//! store uses, built at start-up from `redis.tls_*` (roots: the system's certificates, or
//! `redis.tls_ca_file`; a client certificate for mutual TLS; the name to verify), and the
//! handshake over a connected socket, whose failure names the setting to check.
//!
//! Pure Rust (rustls with ring): no C TLS library. The redis crate's own TLS is not used: the
//! store keeps its own sockets (see `connection.rs`) and wraps them here.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{CertificateError, ClientConfig, RootCertStore};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

/// `redis.tls_*`: where the TLS material is.
#[derive(Debug, Clone, Default)]
pub struct TlsOptions {
    pub ca_file: Option<PathBuf>,
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    pub server_name: Option<String>,
}

/// Why the TLS settings cannot be used: names the setting.
#[derive(Debug, thiserror::Error)]
#[error("{setting}: {reason}")]
pub struct TlsError {
    pub setting: &'static str,
    pub reason: String,
}

fn bad(setting: &'static str, reason: impl Into<String>) -> TlsError {
    TlsError {
        setting,
        reason: reason.into(),
    }
}

/// The TLS client every connection to Redis uses.
pub struct Tls {
    connector: TlsConnector,
    /// `redis.tls_server_name`: verified instead of the address's host.
    server_name: Option<ServerName<'static>>,
    /// The notAfter of the client certificate (`redis.tls_cert_file`), in seconds since the
    /// epoch, when there is one.
    client_not_after: Option<i64>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls")
            .field("server_name", &self.server_name)
            .finish_non_exhaustive()
    }
}

fn read_certs(
    path: &Path,
    setting: &'static str,
) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let pem = std::fs::read(path)
        .map_err(|e| bad(setting, format!("cannot read {}: {e}", path.display())))?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(setting, format!("{} is not PEM: {e}", path.display())))?;
    if certs.is_empty() {
        return Err(bad(
            setting,
            format!("{} holds no PEM certificate", path.display()),
        ));
    }
    Ok(certs)
}

impl Tls {
    /// Reads and checks the TLS material: a missing, unreadable or non-PEM file, or a
    /// certificate without its key, is an error naming its setting.
    pub fn new(options: &TlsOptions) -> Result<Self, TlsError> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = RootCertStore::empty();
        match &options.ca_file {
            Some(path) => {
                for cert in read_certs(path, "redis.tls_ca_file")? {
                    roots.add(cert).map_err(|e| {
                        bad(
                            "redis.tls_ca_file",
                            format!("{}: not a CA certificate: {e}", path.display()),
                        )
                    })?;
                }
            }
            None => {
                let found = rustls_native_certs::load_native_certs();
                // A few unparsable system certificates do not matter; none at all does.
                roots.add_parsable_certificates(found.certs);
                if roots.is_empty() {
                    return Err(bad(
                        "redis.tls_ca_file",
                        "no system root certificates found: set a CA bundle",
                    ));
                }
            }
        }
        let builder = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| bad("redis.tls_ca_file", e.to_string()))?
            .with_root_certificates(roots);
        let mut client_not_after = None;
        let config = match (&options.cert_file, &options.key_file) {
            (None, None) => builder.with_no_client_auth(),
            (Some(_), None) => {
                return Err(bad(
                    "redis.tls_key_file",
                    "must be set with redis.tls_cert_file",
                ))
            }
            (None, Some(_)) => {
                return Err(bad(
                    "redis.tls_cert_file",
                    "must be set with redis.tls_key_file",
                ))
            }
            (Some(cert), Some(key)) => {
                let chain = read_certs(cert, "redis.tls_cert_file")?;
                let not_after = x509_parser::parse_x509_certificate(&chain[0])
                    .map(|(_, c)| c.validity().not_after.timestamp())
                    .map_err(|e| {
                        bad(
                            "redis.tls_cert_file",
                            format!("{}: not an X.509 certificate: {e}", cert.display()),
                        )
                    })?;
                client_not_after = Some(not_after);
                let pem = std::fs::read(key).map_err(|e| {
                    bad(
                        "redis.tls_key_file",
                        format!("cannot read {}: {e}", key.display()),
                    )
                })?;
                let key_der = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
                    bad(
                        "redis.tls_key_file",
                        format!("{} holds no PEM private key: {e}", key.display()),
                    )
                })?;
                builder
                    .with_client_auth_cert(chain, key_der)
                    .map_err(|e| bad("redis.tls_key_file", e.to_string()))?
            }
        };
        let server_name = match &options.server_name {
            Some(name) => Some(
                ServerName::try_from(name.clone())
                    .map_err(|e| bad("redis.tls_server_name", e.to_string()))?,
            ),
            None => None,
        };
        Ok(Tls {
            connector: TlsConnector::from(Arc::new(config)),
            server_name,
            client_not_after,
        })
    }

    /// The notAfter of the client certificate shown to Redis (`redis.tls_cert_file`), in
    /// seconds since the epoch; `None` without one. Read once, at start-up: the file is not
    /// reloaded.
    pub fn client_certificate_not_after(&self) -> Option<i64> {
        self.client_not_after
    }

    /// The TLS handshake over `socket`, connected to `host:port`. A failure says why, and which
    /// setting to check.
    pub async fn handshake(
        &self,
        host: &str,
        port: u16,
        socket: TcpStream,
    ) -> io::Result<TlsStream<TcpStream>> {
        let name = match &self.server_name {
            Some(name) => name.clone(),
            None => ServerName::try_from(host.to_owned()).map_err(|e| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{host} is not a name TLS can verify ({e}): set redis.tls_server_name"),
                )
            })?,
        };
        let mut stream = self
            .connector
            .connect(name, socket)
            .await
            .map_err(|e| explain(e, host, port))?;
        // In TLS 1.3 the server judges the client's certificate after the client has finished
        // its handshake: a refusal arrives with the first reply. One PING here, at connect time
        // only, makes it a handshake failure rather than a puzzling read error later. Any
        // reply (`+PONG`, `-NOAUTH`) proves the server took the connection.
        stream
            .write_all(b"*1\r\n$4\r\nPING\r\n")
            .await
            .map_err(|e| explain(e, host, port))?;
        let mut line = Vec::with_capacity(64);
        let mut byte = [0u8; 1];
        while !line.ends_with(b"\r\n") {
            let n = stream
                .read(&mut byte)
                .await
                .map_err(|e| explain(e, host, port))?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "TLS handshake with Redis at {host}:{port} failed: the server closed the \
                         connection (check redis.tls_cert_file and redis.tls_key_file)"
                    ),
                ));
            }
            line.push(byte[0]);
        }
        Ok(stream)
    }
}

/// A failure on a TLS connection in words an operator acts on, naming the setting to check.
pub fn explain(e: io::Error, host: &str, port: u16) -> io::Error {
    let Some(tls) = e.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) else {
        return e;
    };
    let hint = match tls {
        rustls::Error::InvalidCertificate(c) => match c {
            CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. } => {
                " (check redis.tls_server_name)"
            }
            CertificateError::Expired
            | CertificateError::ExpiredContext { .. }
            | CertificateError::NotValidYet
            | CertificateError::NotValidYetContext { .. } => {
                " (the server's certificate is out of its validity period)"
            }
            _ => " (check redis.tls_ca_file)",
        },
        rustls::Error::AlertReceived(
            rustls::AlertDescription::CertificateRequired
            | rustls::AlertDescription::HandshakeFailure
            | rustls::AlertDescription::BadCertificate
            | rustls::AlertDescription::UnknownCA
            | rustls::AlertDescription::CertificateUnknown
            | rustls::AlertDescription::CertificateExpired,
        ) => " (check redis.tls_cert_file and redis.tls_key_file)",
        _ => "",
    };
    io::Error::new(
        e.kind(),
        format!("TLS handshake with Redis at {host}:{port} failed: {tls}{hint}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A self-signed certificate expiring at `not_after` (seconds since the epoch) and its key,
    /// written to a directory of the test's own.
    fn self_signed(name: &str, not_after: i64) -> (PathBuf, PathBuf, PathBuf) {
        let dir = std::env::temp_dir().join(format!(
            "ratelimiter-redis-tls-{name}-{}",
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("dir");
        let mut params =
            rcgen::CertificateParams::new(vec!["client.test".to_owned()]).expect("params");
        params.not_after = rcgen::date_time_ymd(1975, 1, 1)
            + std::time::Duration::from_secs((not_after - 157_766_400) as u64);
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.self_signed(&key).expect("certificate");
        let (cert_path, key_path) = (dir.join("client.pem"), dir.join("client.key"));
        std::fs::write(&cert_path, cert.pem()).expect("write");
        std::fs::write(&key_path, key.serialize_pem()).expect("write");
        (dir, cert_path, key_path)
    }

    #[test]
    fn the_client_certificate_expiry_is_read_from_its_file() {
        // 2030-01-01T00:00:00Z.
        let not_after = 1_893_456_000;
        let (dir, cert, key) = self_signed("expiry", not_after);
        let options = TlsOptions {
            ca_file: Some(cert.clone()),
            cert_file: Some(cert.clone()),
            key_file: Some(key),
            server_name: None,
        };
        let tls = Tls::new(&options).expect("usable TLS settings");
        assert_eq!(tls.client_certificate_not_after(), Some(not_after));
        let without = Tls::new(&TlsOptions {
            ca_file: Some(cert),
            ..TlsOptions::default()
        })
        .expect("usable TLS settings");
        assert_eq!(without.client_certificate_not_after(), None);
        let _ = std::fs::remove_dir_all(dir);
    }
}
