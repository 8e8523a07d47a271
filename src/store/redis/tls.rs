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
        })
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
