//! Test certificates: a private CA of its own per [`TestPki`], and certificates it issues
//! (servers, clients, short-lived and expired ones), in memory ([`Leaf`]) or written as PEM
//! files to a temporary directory removed on drop. Generic: any test that needs TLS material
//! (Redis over TLS, a TLS listener) uses it. Paths are answered as strings, the form settings
//! and `redis-server` arguments take.

use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, SystemTime};

use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, Issuer,
    KeyPair,
};

/// A CA and the directory its files are written to.
pub struct TestPki {
    dir: PathBuf,
    ca: Issuer<'static, KeyPair>,
    ca_pem: String,
    ca_file: String,
}

/// A certificate and its key, in PEM.
pub struct Leaf {
    pub cert: String,
    pub key: String,
}

/// How long a certificate [`TestPki`] issues is valid.
#[derive(Debug, Clone, Copy)]
pub enum Validity {
    /// rcgen's default: 1975 to 4096.
    Long,
    /// From 2019 to 2020.
    Expired,
    /// Until this many days from now.
    Days(u64),
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
        let ca_pem = cert.pem();
        let ca_file = dir.join("ca.pem");
        std::fs::write(&ca_file, &ca_pem).expect("write ca.pem");
        Self {
            ca_file: ca_file.to_string_lossy().into_owned(),
            dir,
            ca: Issuer::new(params, key),
            ca_pem,
        }
    }

    /// The CA's certificate file (PEM).
    pub fn ca_file(&self) -> &str {
        &self.ca_file
    }

    /// The CA's certificate (PEM), for a client that trusts it.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The path of `name` in the PKI's directory (removed with it).
    pub fn path(&self, name: &str) -> String {
        self.dir.join(name).to_string_lossy().into_owned()
    }

    /// A certificate named `cn` for `sans` (DNS names or IP addresses) signed by the CA, in
    /// memory. No extended key usage, so that it serves as a server's and a client's (Redis's
    /// cluster bus uses it as both).
    pub fn leaf(&self, cn: &str, sans: &[&str], validity: Validity) -> Leaf {
        let sans: Vec<String> = sans.iter().map(|s| s.to_string()).collect();
        let mut params = CertificateParams::new(sans).expect("certificate params");
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, cn);
        params.distinguished_name = dn;
        match validity {
            Validity::Long => {}
            Validity::Expired => {
                params.not_before = date_time_ymd(2019, 1, 1);
                params.not_after = date_time_ymd(2020, 1, 1);
            }
            Validity::Days(days) => {
                // rcgen takes `time` dates: 1975-01-01 is 157,766,400 s after the epoch.
                let now = SystemTime::now()
                    .duration_since(SystemTime::UNIX_EPOCH)
                    .expect("clock after 1970")
                    .as_secs();
                params.not_before = date_time_ymd(1975, 1, 1);
                params.not_after = date_time_ymd(1975, 1, 1)
                    + Duration::from_secs(now - 157_766_400 + days * 86_400);
            }
        }
        let key = KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.ca).expect("sign");
        Leaf {
            cert: cert.pem(),
            key: key.serialize_pem(),
        }
    }

    /// Writes `leaf` as `<name>.pem` and `<name>.key`, answering their paths.
    pub fn write(&self, name: &str, leaf: &Leaf) -> (String, String) {
        let (cert, key) = (
            self.path(&format!("{name}.pem")),
            self.path(&format!("{name}.key")),
        );
        std::fs::write(&cert, &leaf.cert).expect("write certificate");
        std::fs::write(&key, &leaf.key).expect("write key");
        (cert, key)
    }

    /// [`TestPki::leaf`] named `name`, written by [`TestPki::write`]: its certificate and key
    /// files.
    pub fn issue_valid(&self, name: &str, sans: &[&str], validity: Validity) -> (String, String) {
        self.write(name, &self.leaf(name, sans, validity))
    }

    /// A certificate file and its key, valid now (see [`TestPki::leaf`]).
    pub fn issue(&self, name: &str, sans: &[&str]) -> (String, String) {
        self.issue_valid(name, sans, Validity::Long)
    }
}

impl Drop for TestPki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
