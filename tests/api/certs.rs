//! Test certificates: a private CA of its own per [`TestPki`], and certificates it issues
//! (servers, clients, expired ones), written as PEM files to a temporary directory removed on
//! drop. Generic: any test that needs TLS material (Redis over TLS, a TLS listener) uses it.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer,
    KeyPair,
};

/// A CA and the directory its files are written to.
pub struct TestPki {
    dir: PathBuf,
    ca: Issuer<'static, KeyPair>,
    ca_pem: PathBuf,
}

impl TestPki {
    /// A new CA, its certificate written to `ca.pem`.
    pub fn new() -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "ratelimiter-pki-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("pki dir");
        // A name of its own, so that another PKI's CA is an unknown issuer, not a bad signature.
        let ca_name = format!("ratelimiter test CA {}", dir.display());
        let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, ca_name);
        params.distinguished_name = dn;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        let ca_pem = dir.join("ca.pem");
        std::fs::write(&ca_pem, cert.pem()).expect("write ca.pem");
        Self {
            dir,
            ca: Issuer::new(params, key),
            ca_pem,
        }
    }

    /// The CA's certificate (PEM).
    pub fn ca_pem_path(&self) -> &Path {
        &self.ca_pem
    }

    /// A certificate for `sans` (DNS names or IP addresses) signed by the CA, valid now: its
    /// certificate and key files, `<name>.pem` and `<name>.key`. No extended key usage, so
    /// that it serves as a server's and a client's (Redis's cluster bus uses it as both).
    pub fn issue(&self, name: &str, sans: &[&str]) -> (PathBuf, PathBuf) {
        self.issue_valid(name, sans, false)
    }

    /// Like [`TestPki::issue`], but expired since 2020.
    pub fn issue_expired(&self, name: &str, sans: &[&str]) -> (PathBuf, PathBuf) {
        self.issue_valid(name, sans, true)
    }

    fn issue_valid(&self, name: &str, sans: &[&str], expired: bool) -> (PathBuf, PathBuf) {
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).expect("certificate params");
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, name);
        params.distinguished_name = dn;
        if expired {
            params.not_before = date_time_ymd(2019, 1, 1);
            params.not_after = date_time_ymd(2020, 1, 1);
        }
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.ca).expect("sign");
        let (cert_path, key_path) = (
            self.dir.join(format!("{name}.pem")),
            self.dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).expect("write certificate");
        std::fs::write(&key_path, key.serialize_pem()).expect("write key");
        (cert_path, key_path)
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
