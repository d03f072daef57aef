//! Throw-away certificates for TLS tests, made with the `openssl` command in a fresh temp dir
//! (removed on `Drop`): a CA, a server and a client certificate it signed, a second unrelated
//! CA, a server certificate for the wrong name, and a file that is not PEM.
//!
//! Every key is EC P-256 in PKCS#8 PEM (`-----BEGIN PRIVATE KEY-----`), every certificate is
//! X.509 v3 with the extensions rustls/webpki insist on (`basicConstraints CA:TRUE` and
//! `keyUsage keyCertSign` on the CAs, `subjectAltName` and `extendedKeyUsage` on the leaves).
//!
//! ```no_run
//! use sfu_redis_testkit::devserver::{LocalRedis, TlsServer};
//! use sfu_redis_testkit::tls::TestCerts;
//!
//! let certs = TestCerts::generate()?;
//! let server = LocalRedis::start_tls(&certs, TlsServer::default())?;
//! let url = server.tls_url(); // rediss://127.0.0.1:<port>, trust certs.ca()
//! # Ok::<(), sfu_redis::Error>(())
//! ```

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use sfu_redis::Result;

use crate::cli::{io, run};

/// The extensions of every certificate made here (an `openssl` config file).
const OPENSSL_CONF: &str = "\
[req]
distinguished_name = dn
prompt = no

[dn]
CN = sfu-redis testkit

[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash

[server]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth,clientAuth
subjectAltName = IP:127.0.0.1,DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer

[client]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = clientAuth
subjectAltName = DNS:sfu-redis-test-client
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer

[wrong_name]
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature
extendedKeyUsage = serverAuth,clientAuth
subjectAltName = DNS:wrong.example
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid,issuer
";

/// How long one `openssl` run may take.
const OPENSSL_TIMEOUT: Duration = Duration::from_secs(20);

/// Test certificates in a temp dir (removed on `Drop`). Every accessor returns the path of a
/// PEM file in [`TestCerts::dir`]:
///
/// | accessor | file | what |
/// |---|---|---|
/// | [`ca`](TestCerts::ca) | `ca.crt` | the CA (`ca.key` next to it) |
/// | [`server_cert`](TestCerts::server_cert) / [`server_key`](TestCerts::server_key) | `server.crt` / `server.key` | signed by the CA, SAN `IP:127.0.0.1, DNS:localhost`, EKU serverAuth + clientAuth (Redis also presents it when it connects to a master or, as a sentinel, to anything) |
/// | [`client_cert`](TestCerts::client_cert) / [`client_key`](TestCerts::client_key) | `client.crt` / `client.key` | signed by the CA, EKU clientAuth |
/// | [`other_ca`](TestCerts::other_ca) | `other-ca.crt` | an unrelated CA: "wrong CA" tests |
/// | [`wrong_name_cert`](TestCerts::wrong_name_cert) / [`wrong_name_key`](TestCerts::wrong_name_key) | `wrong-name.crt` / `wrong-name.key` | signed by the CA, valid only for `DNS:wrong.example`: "name mismatch" tests |
/// | [`not_pem`](TestCerts::not_pem) | `not-pem.txt` | text that is not PEM |
///
/// Certificates are valid from generation for 10 years.
#[derive(Debug)]
pub struct TestCerts {
    dir: PathBuf,
}

impl TestCerts {
    /// Generates the set (eight `openssl` runs; typically well under a second).
    ///
    /// # Errors
    /// [`sfu_redis::Error::Io`] when `openssl` is not on `PATH` (the message says to install
    /// it), when a run fails (the message holds its stderr) or when the temp dir cannot be
    /// written.
    pub fn generate() -> Result<TestCerts> {
        sweep_dead_processes_dirs();
        let dir = std::env::temp_dir().join(format!(
            "sfu-redis-certs-{}-{:08x}",
            std::process::id(),
            fastrand::u32(..)
        ));
        std::fs::create_dir_all(&dir).map_err(|e| io(format!("create {}", dir.display()), e))?;
        // From here on `Drop` removes the dir, also when a step fails.
        let certs = TestCerts { dir };
        certs.make()?;
        Ok(certs)
    }

    fn make(&self) -> Result<()> {
        let conf = self.dir.join("openssl.cnf");
        std::fs::write(&conf, OPENSSL_CONF)
            .map_err(|e| io(format!("write {}", conf.display()), e))?;
        self.self_signed("ca", "/CN=sfu-redis testkit CA", &conf)?;
        self.self_signed("other-ca", "/CN=sfu-redis testkit other CA", &conf)?;
        self.leaf("server", "/CN=localhost", "server", &conf)?;
        self.leaf("client", "/CN=sfu-redis test client", "client", &conf)?;
        self.leaf("wrong-name", "/CN=wrong.example", "wrong_name", &conf)?;
        let not_pem = self.not_pem();
        std::fs::write(
            &not_pem,
            "This is not a PEM file: no -----BEGIN line, no base64.\n",
        )
        .map_err(|e| io(format!("write {}", not_pem.display()), e))?;
        // Only the leaf requests were temporary.
        for name in ["server", "client", "wrong-name"] {
            let _ = std::fs::remove_file(self.dir.join(format!("{name}.csr")));
        }
        Ok(())
    }

    /// A self-signed CA: `<name>.crt`, `<name>.key`.
    fn self_signed(&self, name: &str, subject: &str, conf: &Path) -> Result<()> {
        openssl(
            Command::new("openssl")
                .args(["req", "-x509", "-new", "-newkey", "ec"])
                .args(["-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
                .arg("-keyout")
                .arg(self.dir.join(format!("{name}.key")))
                .arg("-out")
                .arg(self.dir.join(format!("{name}.crt")))
                .args(["-days", "3650", "-sha256", "-subj", subject])
                .arg("-config")
                .arg(conf)
                .args(["-extensions", "ca"])
                .args(["-set_serial", &serial()]),
            &format!("make the test CA {name}.crt"),
        )
    }

    /// A key, a request and a certificate signed by `ca.crt` with the extensions of config
    /// section `section`: `<name>.crt`, `<name>.key`.
    fn leaf(&self, name: &str, subject: &str, section: &str, conf: &Path) -> Result<()> {
        let csr = self.dir.join(format!("{name}.csr"));
        openssl(
            Command::new("openssl")
                .args(["req", "-new", "-newkey", "ec"])
                .args(["-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"])
                .arg("-keyout")
                .arg(self.dir.join(format!("{name}.key")))
                .arg("-out")
                .arg(&csr)
                .args(["-subj", subject])
                .arg("-config")
                .arg(conf),
            &format!("make the key and request of {name}.crt"),
        )?;
        openssl(
            Command::new("openssl")
                .args(["x509", "-req", "-in"])
                .arg(&csr)
                .arg("-CA")
                .arg(self.ca())
                .arg("-CAkey")
                .arg(self.dir.join("ca.key"))
                .args(["-set_serial", &serial(), "-days", "3650", "-sha256"])
                .arg("-extfile")
                .arg(conf)
                .args(["-extensions", section])
                .arg("-out")
                .arg(self.dir.join(format!("{name}.crt"))),
            &format!("sign {name}.crt with the test CA"),
        )
    }

    /// The temp dir holding every file.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `ca.crt`: the CA that signed the server, client and wrong-name certificates.
    pub fn ca(&self) -> PathBuf {
        self.dir.join("ca.crt")
    }

    /// `server.crt`: SAN `IP:127.0.0.1, DNS:localhost`, signed by [`TestCerts::ca`].
    pub fn server_cert(&self) -> PathBuf {
        self.dir.join("server.crt")
    }

    /// `server.key`: the key of [`TestCerts::server_cert`] (PKCS#8 PEM).
    pub fn server_key(&self) -> PathBuf {
        self.dir.join("server.key")
    }

    /// `client.crt`: a client certificate (EKU clientAuth) signed by [`TestCerts::ca`].
    pub fn client_cert(&self) -> PathBuf {
        self.dir.join("client.crt")
    }

    /// `client.key`: the key of [`TestCerts::client_cert`] (PKCS#8 PEM).
    pub fn client_key(&self) -> PathBuf {
        self.dir.join("client.key")
    }

    /// `other-ca.crt`: a CA that signed none of the others ("wrong CA" tests).
    pub fn other_ca(&self) -> PathBuf {
        self.dir.join("other-ca.crt")
    }

    /// `wrong-name.crt`: signed by [`TestCerts::ca`], valid only for `DNS:wrong.example` (no
    /// IP SAN): a client checking the name of `127.0.0.1` or `localhost` must refuse it.
    pub fn wrong_name_cert(&self) -> PathBuf {
        self.dir.join("wrong-name.crt")
    }

    /// `wrong-name.key`: the key of [`TestCerts::wrong_name_cert`] (PKCS#8 PEM).
    pub fn wrong_name_key(&self) -> PathBuf {
        self.dir.join("wrong-name.key")
    }

    /// `not-pem.txt`: a text file that is not PEM (for "bad certificate file" tests).
    pub fn not_pem(&self) -> PathBuf {
        self.dir.join("not-pem.txt")
    }
}

/// Removes the certificate dirs of processes that are gone: a set kept in a `static` for a
/// whole test binary is never dropped, so each run would leave one behind (keys included).
fn sweep_dead_processes_dirs() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(rest) = name
            .to_str()
            .and_then(|n| n.strip_prefix("sfu-redis-certs-"))
        else {
            continue;
        };
        let Some(pid) = rest.split('-').next().filter(|p| p.parse::<u32>().is_ok()) else {
            continue;
        };
        if !Path::new("/proc").join(pid).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for TestCerts {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A random positive 63-bit serial number, in hex.
fn serial() -> String {
    format!("0x{:016x}", fastrand::u64(1..i64::MAX as u64))
}

fn openssl(cmd: &mut Command, what: &str) -> Result<()> {
    let done = run(
        cmd,
        "openssl",
        "install openssl (Debian: apt-get install openssl)",
        OPENSSL_TIMEOUT,
    )?;
    if done.status.success() {
        Ok(())
    } else {
        Err(io(
            format!(
                "{what}: openssl failed ({}): {}",
                done.status,
                done.stderr.trim()
            ),
            std::io::Error::other("openssl failed"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    fn openssl_ok(args: &[&str], files: &[&Path]) -> (bool, String) {
        let mut cmd = Command::new("openssl");
        cmd.args(args).args(files);
        let done =
            run(&mut cmd, "openssl", "install openssl", OPENSSL_TIMEOUT).expect("run openssl");
        (
            done.status.success(),
            format!("{}{}", done.stdout, done.stderr),
        )
    }

    fn verify(ca: &Path, cert: &Path) -> (bool, String) {
        let mut cmd = Command::new("openssl");
        cmd.arg("verify").arg("-CAfile").arg(ca).arg(cert);
        let done = run(&mut cmd, "openssl", "install openssl", OPENSSL_TIMEOUT)
            .expect("run openssl verify");
        (
            done.status.success(),
            format!("{}{}", done.stdout, done.stderr),
        )
    }

    #[test]
    fn generates_a_verifiable_set_and_removes_it_on_drop() {
        let t = Instant::now();
        let certs = TestCerts::generate().expect("generate test certificates");
        let took = t.elapsed();
        // Well under 2 s on an idle machine; the bound leaves room for a loaded one.
        assert!(took < Duration::from_secs(5), "generation took {took:?}");

        for leaf in [
            certs.server_cert(),
            certs.client_cert(),
            certs.wrong_name_cert(),
        ] {
            let (ok, said) = verify(&certs.ca(), &leaf);
            assert!(ok, "{} must verify against ca.crt: {said}", leaf.display());
            let (ok, said) = verify(&certs.other_ca(), &leaf);
            assert!(
                !ok,
                "{} must not verify against other-ca.crt: {said}",
                leaf.display()
            );
        }

        // X.509 v3 with the names and purposes webpki checks.
        let (ok, text) = openssl_ok(&["x509", "-noout", "-text", "-in"], &[&certs.server_cert()]);
        assert!(ok, "{text}");
        assert!(text.contains("Version: 3"), "{text}");
        assert!(text.contains("IP Address:127.0.0.1"), "{text}");
        assert!(text.contains("DNS:localhost"), "{text}");
        assert!(text.contains("TLS Web Server Authentication"), "{text}");
        let (ok, text) = openssl_ok(&["x509", "-noout", "-text", "-in"], &[&certs.ca()]);
        assert!(ok, "{text}");
        assert!(text.contains("CA:TRUE"), "{text}");
        assert!(text.contains("Certificate Sign"), "{text}");
        let (ok, text) = openssl_ok(&["x509", "-noout", "-text", "-in"], &[&certs.client_cert()]);
        assert!(ok, "{text}");
        assert!(text.contains("TLS Web Client Authentication"), "{text}");
        let (ok, text) = openssl_ok(
            &["x509", "-noout", "-text", "-in"],
            &[&certs.wrong_name_cert()],
        );
        assert!(ok, "{text}");
        assert!(text.contains("DNS:wrong.example"), "{text}");
        assert!(!text.contains("127.0.0.1"), "{text}");
        assert!(!text.contains("DNS:localhost"), "{text}");

        // Keys in PKCS#8 PEM, each matching its certificate.
        for (cert, key) in [
            (certs.server_cert(), certs.server_key()),
            (certs.client_cert(), certs.client_key()),
            (certs.wrong_name_cert(), certs.wrong_name_key()),
        ] {
            let pem = std::fs::read_to_string(&key).expect("read key");
            assert!(pem.starts_with("-----BEGIN PRIVATE KEY-----"), "{pem}");
            let (ok, cert_pub) = openssl_ok(&["x509", "-noout", "-pubkey", "-in"], &[&cert]);
            assert!(ok, "{cert_pub}");
            let (ok, key_pub) = openssl_ok(&["pkey", "-pubout", "-in"], &[&key]);
            assert!(ok, "{key_pub}");
            assert_eq!(
                cert_pub,
                key_pub,
                "{} and {}",
                cert.display(),
                key.display()
            );
        }

        let not_pem = std::fs::read_to_string(certs.not_pem()).expect("read not-pem.txt");
        assert!(!not_pem.is_empty());
        let (ok, _) = openssl_ok(&["x509", "-noout", "-in"], &[&certs.not_pem()]);
        assert!(!ok, "not-pem.txt must not parse as a certificate");

        let dir = certs.dir().to_path_buf();
        assert!(dir.join("ca.key").is_file());
        drop(certs);
        assert!(!dir.exists(), "{} must be removed on drop", dir.display());
    }
}
