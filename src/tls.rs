//! TLS on the listeners: loading a listener's certificate, key and client CA from PEM files,
//! the rustls `ServerConfig` both listeners serve with, reloading those files without a restart,
//! and how long each certificate has left.
//!
//! The client certificate shown to Redis (`redis.tls_cert_file`, see `store::redis::tls`) is
//! read once at start-up; its days left are watched here beside the listeners'.
//!
//! Reload: the files are read again on SIGHUP and whenever a poll, every [`POLL_INTERVAL`],
//! sees one of them change (modification time or size). New handshakes take the new
//! certificate (and client CA); connections already established keep the keys they agreed on,
//! since a `ServerConfig` asks its resolver and verifier for each handshake only. A reload that
//! fails (unreadable file, bad PEM, a key that is not the certificate's) keeps the certificate
//! in use, logs an error naming the setting and counts [`crate::metrics::TLS_RELOAD_FAILURES`].

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    DigitallySignedStruct, DistinguishedName, RootCertStore, ServerConfig, SignatureScheme,
};

/// How often the files are checked for a change (fixed: SIGHUP reloads at once).
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Under this many days left, `/readyz` warns of a certificate's expiry (and stays 200).
pub const EXPIRY_WARNING_DAYS: f64 = 14.0;

/// The certificates this instance shows, for `/readyz` and the expiry gauge: its listeners'
/// (reloaded from their files) and the client certificate it shows Redis (`redis.tls_cert_file`,
/// read once at start-up).
#[derive(Debug, Clone, Default)]
pub struct Certificates {
    pub listeners: Vec<Arc<Reloadable>>,
    /// The notAfter (seconds since the epoch) of the client certificate, when Redis is reached
    /// over TLS with one.
    pub redis_client: Option<i64>,
}

impl Certificates {
    /// The listeners' certificates and the Redis client certificate's notAfter; sets the
    /// latter's gauge (the listeners' is set when they load).
    pub fn new(listeners: Vec<Arc<Reloadable>>, redis_client: Option<i64>) -> Self {
        let this = Self {
            listeners,
            redis_client,
        };
        this.publish_redis_expiry();
        this
    }

    /// A warning for each certificate with less than [`EXPIRY_WARNING_DAYS`] left (or expired).
    pub fn expiry_warnings(&self) -> Vec<String> {
        let listeners = self.listeners.iter().map(|c| {
            (
                format!("the {} listener's TLS certificate", c.listener()),
                c.days_left(),
            )
        });
        let redis = self
            .redis_client
            .map(|n| ("the Redis client TLS certificate".to_owned(), days_until(n)));
        listeners
            .chain(redis)
            .filter_map(|(what, days)| expiry_warning(&what, days))
            .collect()
    }

    /// The gauge of the Redis client certificate, labelled `certificate="redis"`.
    fn publish_redis_expiry(&self) {
        if let Some(not_after) = self.redis_client {
            metrics::gauge!(crate::metrics::TLS_CERTIFICATE_EXPIRY_DAYS, "certificate" => "redis")
                .set(days_until(not_after));
        }
    }
}

/// Days from now until `not_after` (seconds since the epoch): negative once it has passed.
pub fn days_until(not_after: i64) -> f64 {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    (not_after as f64 - now) / 86_400.0
}

/// The warning for `what` (a certificate) with `days` left, when that is under
/// [`EXPIRY_WARNING_DAYS`].
fn expiry_warning(what: &str, days: f64) -> Option<String> {
    if days >= EXPIRY_WARNING_DAYS {
        None
    } else if days < 0.0 {
        Some(format!("{what} expired {:.1} days ago", -days))
    } else {
        Some(format!("{what} expires in {days:.1} days"))
    }
}

/// A certificate or key that cannot be used, naming the setting whose file it is.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{setting}: cannot read {path}: {source}")]
    Read {
        setting: String,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{setting}: {path}: {reason}")]
    Invalid {
        setting: String,
        path: PathBuf,
        reason: String,
    },
}

/// The files of one listener, and the prefix of their settings (`server` or `grpc`).
#[derive(Debug, Clone)]
pub struct TlsFiles {
    pub section: &'static str,
    pub cert: PathBuf,
    pub key: PathBuf,
    pub client_ca: Option<PathBuf>,
}

impl TlsFiles {
    /// The files of `section`'s settings, when a certificate is set (the configuration checks
    /// that a certificate comes with its key).
    pub fn new(
        section: &'static str,
        cert: Option<&Path>,
        key: Option<&Path>,
        client_ca: Option<&Path>,
    ) -> Option<Self> {
        Some(Self {
            section,
            cert: cert?.to_owned(),
            key: key?.to_owned(),
            client_ca: client_ca.map(Path::to_owned),
        })
    }

    /// The listener's name in metrics (the expiry gauge's `certificate`, the reload failures'
    /// `listener`) and warnings: `http` or `grpc`.
    pub fn listener(&self) -> &'static str {
        if self.section == "grpc" {
            "grpc"
        } else {
            "http"
        }
    }

    fn setting(&self, name: &str) -> String {
        format!("{}.{name}", self.section)
    }

    /// Each file's modification time, size and inode (of the file its symlinks lead to), to
    /// see it change: the inode tells a replacement that kept the other two (`cp -p`, a
    /// Secret's `..data` swap to files written in the same second with the same length).
    fn stamp(&self) -> Vec<Option<(SystemTime, u64, u64)>> {
        use std::os::unix::fs::MetadataExt as _;
        std::iter::once(&self.cert)
            .chain(std::iter::once(&self.key))
            .chain(self.client_ca.iter())
            .map(|p| {
                std::fs::metadata(p)
                    .ok()
                    .and_then(|m| Some((m.modified().ok()?, m.len(), m.ino())))
            })
            .collect()
    }
}

/// What one load of the files gave.
struct Loaded {
    key: Arc<CertifiedKey>,
    verifier: Option<Arc<dyn ClientCertVerifier>>,
    /// The certificate's notAfter, in seconds since the epoch.
    not_after: i64,
}

fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn read(setting: &str, path: &Path) -> Result<Vec<u8>, TlsError> {
    std::fs::read(path).map_err(|source| TlsError::Read {
        setting: setting.to_owned(),
        path: path.to_owned(),
        source,
    })
}

fn certificates(setting: &str, path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let invalid = |reason: String| TlsError::Invalid {
        setting: setting.to_owned(),
        path: path.to_owned(),
        reason,
    };
    let pem = read(setting, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| invalid(format!("not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(invalid("holds no PEM certificate".to_owned()));
    }
    Ok(certs)
}

fn load(files: &TlsFiles) -> Result<Loaded, TlsError> {
    let cert_setting = files.setting("tls_cert_file");
    let key_setting = files.setting("tls_key_file");
    let chain = certificates(&cert_setting, &files.cert)?;
    let not_after = x509_parser::parse_x509_certificate(&chain[0])
        .map(|(_, c)| c.validity().not_after.timestamp())
        .map_err(|e| TlsError::Invalid {
            setting: cert_setting.clone(),
            path: files.cert.clone(),
            reason: format!("not an X.509 certificate: {e}"),
        })?;
    let key_pem = read(&key_setting, &files.key)?;
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Invalid {
        setting: key_setting.clone(),
        path: files.key.clone(),
        reason: format!("not a PEM private key: {e}"),
    })?;
    let key = CertifiedKey::from_der(chain, key, &provider()).map_err(|e| TlsError::Invalid {
        setting: key_setting.clone(),
        path: files.key.clone(),
        reason: format!("not the key of {cert_setting}: {e}"),
    })?;
    let verifier = match &files.client_ca {
        None => None,
        Some(path) => {
            let setting = files.setting("tls_client_ca_file");
            let mut roots = RootCertStore::empty();
            for cert in certificates(&setting, path)? {
                roots.add(cert).map_err(|e| TlsError::Invalid {
                    setting: setting.clone(),
                    path: path.clone(),
                    reason: format!("not a CA certificate: {e}"),
                })?;
            }
            let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| TlsError::Invalid {
                    setting: setting.clone(),
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            Some(verifier)
        }
    };
    Ok(Loaded {
        key: Arc::new(key),
        verifier,
        not_after,
    })
}

/// A listener's certificate (and client CA) as last loaded, swapped by a reload.
pub struct Reloadable {
    files: TlsFiles,
    current: RwLock<Arc<CertifiedKey>>,
    verifier: RwLock<Option<Arc<dyn ClientCertVerifier>>>,
    not_after: RwLock<i64>,
    stamp: RwLock<Vec<Option<(SystemTime, u64, u64)>>>,
}

impl fmt::Debug for Reloadable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Reloadable")
            .field("files", &self.files)
            .finish_non_exhaustive()
    }
}

impl Reloadable {
    /// Loads `files`, failing with the setting whose file cannot be used.
    pub fn load(files: TlsFiles) -> Result<Arc<Self>, TlsError> {
        let stamp = files.stamp();
        let loaded = load(&files)?;
        let this = Arc::new(Self {
            files,
            current: RwLock::new(loaded.key),
            verifier: RwLock::new(loaded.verifier),
            not_after: RwLock::new(loaded.not_after),
            stamp: RwLock::new(stamp),
        });
        this.publish_expiry();
        Ok(this)
    }

    pub fn listener(&self) -> &'static str {
        self.files.listener()
    }

    /// Days until the certificate in use expires (negative once it has).
    pub fn days_left(&self) -> f64 {
        days_until(self.not_after.read().map_or(0, |n| *n))
    }

    fn publish_expiry(&self) {
        metrics::gauge!(crate::metrics::TLS_CERTIFICATE_EXPIRY_DAYS, "certificate" => self.listener())
            .set(self.days_left());
    }

    /// Reads the files again; on failure keeps what is in use, logs and counts it.
    pub fn reload(&self) -> bool {
        let stamp = self.files.stamp();
        if let Ok(mut s) = self.stamp.write() {
            *s = stamp;
        }
        match load(&self.files) {
            Ok(loaded) => {
                if let Ok(mut k) = self.current.write() {
                    *k = loaded.key;
                }
                if let Ok(mut v) = self.verifier.write() {
                    *v = loaded.verifier;
                }
                if let Ok(mut n) = self.not_after.write() {
                    *n = loaded.not_after;
                }
                self.publish_expiry();
                tracing::info!(
                    listener = self.listener(),
                    days_left = self.days_left(),
                    "reloaded the TLS certificate"
                );
                true
            }
            Err(error) => {
                tracing::error!(
                    listener = self.listener(),
                    %error,
                    "TLS reload failed; the certificate in use is kept"
                );
                metrics::counter!(crate::metrics::TLS_RELOAD_FAILURES, "listener" => self.listener())
                    .increment(1);
                self.publish_expiry();
                false
            }
        }
    }

    /// Reloads when a file changed since the last load (or attempt).
    fn reload_if_changed(&self) {
        let changed = self.stamp.read().map_or(true, |s| *s != self.files.stamp());
        if changed {
            self.reload();
        } else {
            self.publish_expiry();
        }
    }

    /// The `ServerConfig` of this listener, with `alpn` (most preferred first): its certificate
    /// and client CA come from this, at each handshake.
    pub fn server_config(self: &Arc<Self>, alpn: &[&[u8]]) -> Result<ServerConfig, TlsError> {
        let builder = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| TlsError::Invalid {
                setting: self.files.setting("tls_cert_file"),
                path: self.files.cert.clone(),
                reason: e.to_string(),
            })?;
        let has_ca = self.verifier.read().is_ok_and(|v| v.is_some());
        let builder = if has_ca {
            builder.with_client_cert_verifier(Arc::new(ClientCa(self.clone())))
        } else {
            builder.with_no_client_auth()
        };
        let mut config = builder.with_cert_resolver(Arc::new(Resolver(self.clone())));
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        Ok(config)
    }
}

/// Reloads every listener's files on SIGHUP and on a change seen by the poll, and sets the
/// Redis client certificate's gauge at every poll (its days left go down), until `certs` is
/// dropped (its servers stopped).
pub fn spawn_reloader(certs: &Arc<Certificates>) {
    if certs.listeners.is_empty() && certs.redis_client.is_none() {
        return;
    }
    // SIGHUP is taken over only where there is a file to reload.
    let mut hangup = if certs.listeners.is_empty() {
        None
    } else {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(s) => Some(s),
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGHUP: TLS files are reloaded on change only");
                None
            }
        }
    };
    let weak = Arc::downgrade(certs);
    tokio::spawn(async move {
        let mut poll = tokio::time::interval(POLL_INTERVAL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let signalled = tokio::select! {
                _ = poll.tick() => false,
                _ = async {
                    match hangup.as_mut() {
                        Some(h) => { h.recv().await; }
                        None => std::future::pending::<()>().await,
                    }
                } => true,
            };
            let Some(certs) = weak.upgrade() else {
                return;
            };
            for cert in &certs.listeners {
                if signalled {
                    tracing::info!(
                        listener = cert.listener(),
                        "SIGHUP: reloading the TLS files"
                    );
                    cert.reload();
                } else {
                    cert.reload_if_changed();
                }
            }
            certs.publish_redis_expiry();
        }
    });
}

/// Answers every handshake with the certificate in use.
#[derive(Debug)]
struct Resolver(Arc<Reloadable>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        self.0.current.read().ok().map(|k| k.clone())
    }
}

/// Verifies client certificates against the client CA in use.
#[derive(Debug)]
struct ClientCa(Arc<Reloadable>);

impl ClientCa {
    fn inner(&self) -> Result<Arc<dyn ClientCertVerifier>, rustls::Error> {
        self.0
            .verifier
            .read()
            .ok()
            .and_then(|v| v.clone())
            .ok_or_else(|| rustls::Error::General("no client CA loaded".to_owned()))
    }
}

impl ClientCertVerifier for ClientCa {
    // The CA's names are not sent as hints: they change on reload and this answers a borrow.
    // Clients then offer the certificate they have, which is what a sidecar or Envoy does.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.inner()?
            .verify_client_cert(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner()?.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner()?.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner()
            .map(|v| v.supported_verify_schemes())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file replaced by one of the same size and modification time (`cp -p`, or a Secret's
    /// `..data` symlink swapped to files written in the same second) is still seen to change.
    #[test]
    fn a_replacement_with_the_same_size_and_time_changes_the_stamp() {
        let dir = std::env::temp_dir().join(format!("rl-stamp-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("a temporary directory");
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::write(&cert, "first").expect("write");
        std::fs::write(&key, "key").expect("write");
        let files = TlsFiles::new("server", Some(&cert), Some(&key), None).expect("two files");
        let before = files.stamp();
        let when = std::fs::metadata(&cert)
            .and_then(|m| m.modified())
            .expect("mtime");
        let next = dir.join("next.crt");
        std::fs::write(&next, "other").expect("write");
        std::fs::File::options()
            .write(true)
            .open(&next)
            .and_then(|f| f.set_modified(when))
            .expect("set the same modification time");
        std::fs::rename(&next, &cert).expect("replace");
        let after = files.stamp();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(before[0].is_some());
        assert_eq!(before[0].map(|s| (s.0, s.1)), after[0].map(|s| (s.0, s.1)));
        assert_ne!(before, after, "the inode tells the new file");
    }

    #[test]
    fn a_certificate_warns_under_the_threshold_and_says_how_far_past_it_is() {
        let what = "the Redis client TLS certificate";
        assert_eq!(expiry_warning(what, EXPIRY_WARNING_DAYS), None);
        assert_eq!(expiry_warning(what, 20.0), None);
        assert_eq!(
            expiry_warning(what, 4.96).as_deref(),
            Some("the Redis client TLS certificate expires in 5.0 days")
        );
        assert_eq!(
            expiry_warning(what, 0.0).as_deref(),
            Some("the Redis client TLS certificate expires in 0.0 days")
        );
        assert_eq!(
            expiry_warning(what, -2.04).as_deref(),
            Some("the Redis client TLS certificate expired 2.0 days ago")
        );
    }

    #[test]
    fn the_redis_client_certificate_is_among_the_warnings() {
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let soon = Certificates::new(Vec::new(), Some(now + 3 * 86_400 + 3_600));
        assert_eq!(
            soon.expiry_warnings(),
            vec!["the Redis client TLS certificate expires in 3.0 days".to_owned()]
        );
        let later = Certificates::new(Vec::new(), Some(now + 30 * 86_400));
        assert!(later.expiry_warnings().is_empty());
        assert!(Certificates::default().expiry_warnings().is_empty());
    }
}
