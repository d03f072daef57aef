//! TLS to Redis (`rediss://`, `rediss+sentinel://`): the certificate files of a
//! configuration, checked when the configuration is built and read again when a connector is
//! made, and the crypto provider.
//!
//! Verification is on unless [`TlsOptions::insecure`] is set: the server's certificate must
//! chain to the CA file (or, without one, to the system's roots) and name the host of the URL.
//! A client certificate and key (mutual TLS, `tls-auth-clients yes`) are presented when both
//! files are given.
//!
//! The TLS stack is rustls (through redis-rs's `tls-rustls` feature) with the `ring` crypto
//! provider: it builds with the C compiler any Rust toolchain already needs (aws-lc-rs, rustls'
//! default, needs CMake and builds several times longer on 2 cores), and a C++ host linking
//! `libsfu_redis` gets no OpenSSL dependency. The provider is installed as the process default
//! when the first TLS connector is made, unless the host installed one already (then the
//! host's is used).

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The TLS settings of a configuration (builder methods `tls_ca_file`, `tls_cert_file`,
/// `tls_key_file`, `tls_insecure`; environment `SFU_TLS_CA_FILE`, `SFU_TLS_CERT_FILE`,
/// `SFU_TLS_KEY_FILE`, `SFU_TLS_INSECURE=1`). Each file is a PEM path. They apply to
/// `rediss://` and `rediss+sentinel://` URLs only; with a plaintext URL the configuration is
/// refused.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct TlsOptions {
    /// CA certificate(s) the server's certificate must chain to; `None`: the system's roots.
    pub ca_file: Option<PathBuf>,
    /// Client certificate (chain) for mutual TLS; needs `key_file`.
    pub cert_file: Option<PathBuf>,
    /// Private key of `cert_file` (PKCS#8, PKCS#1 or SEC1 PEM); needs `cert_file`.
    pub key_file: Option<PathBuf>,
    /// Skip certificate verification (logged as a warning at every connect). For tests only:
    /// anyone on the path can then read and change the traffic.
    pub insecure: bool,
}

impl TlsOptions {
    /// True when any file or `insecure` is set.
    pub fn is_set(&self) -> bool {
        self.ca_file.is_some()
            || self.cert_file.is_some()
            || self.key_file.is_some()
            || self.insecure
    }

    /// The field name of the first setting that is set (for "set with a plaintext URL").
    pub(crate) fn first_set(&self) -> Option<&'static str> {
        if self.ca_file.is_some() {
            Some("tls_ca_file")
        } else if self.cert_file.is_some() {
            Some("tls_cert_file")
        } else if self.key_file.is_some() {
            Some("tls_key_file")
        } else if self.insecure {
            Some("tls_insecure")
        } else {
            None
        }
    }

    /// Checks that the files exist, are PEM of the right kind, and that the certificate and key
    /// come as a pair. Errors name the field (`tls_ca_file`, `tls_cert_file`, `tls_key_file`).
    pub(crate) fn check(&self) -> Result<()> {
        self.load().map(|_| ())
    }

    /// The files' contents, checked (see [`TlsOptions::check`]).
    pub(crate) fn load(&self) -> Result<Loaded> {
        match (&self.cert_file, &self.key_file) {
            (Some(_), None) => {
                return Err(Error::config(
                    "tls_key_file",
                    "is missing: a client certificate (tls_cert_file) needs its private key",
                ))
            }
            (None, Some(_)) => {
                return Err(Error::config(
                    "tls_cert_file",
                    "is missing: a client key (tls_key_file) needs its certificate",
                ))
            }
            _ => {}
        }
        let ca = self
            .ca_file
            .as_deref()
            .map(|p| read_pem("tls_ca_file", p, Kind::Certificates))
            .transpose()?;
        let client = match (&self.cert_file, &self.key_file) {
            (Some(c), Some(k)) => {
                let cert = read_pem("tls_cert_file", c, Kind::Certificates)?;
                let key = read_pem("tls_key_file", k, Kind::Key)?;
                check_pair(&cert, &key, c, k)?;
                Some((cert, key))
            }
            _ => None,
        };
        Ok(Loaded { ca, client })
    }
}

/// The PEM contents of the configured files.
#[derive(Clone)]
pub(crate) struct Loaded {
    pub ca: Option<Vec<u8>>,
    /// Certificate chain and key.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for Loaded {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Loaded")
            .field("ca", &self.ca.as_ref().map(Vec::len))
            .field("client", &self.client.is_some())
            .finish()
    }
}

impl Loaded {
    /// The certificates in the form redis-rs takes (`None`: system roots, no client cert).
    #[cfg(feature = "tls")]
    pub(crate) fn certificates(&self) -> Option<redis::TlsCertificates> {
        if self.ca.is_none() && self.client.is_none() {
            return None;
        }
        Some(redis::TlsCertificates {
            client_tls: self
                .client
                .as_ref()
                .map(|(cert, key)| redis::ClientTlsConfig {
                    client_cert: cert.clone(),
                    client_key: key.clone(),
                }),
            root_cert: self.ca.clone(),
        })
    }
}

#[derive(Clone, Copy)]
enum Kind {
    Certificates,
    Key,
}

fn read_pem(field: &'static str, path: &Path, kind: Kind) -> Result<Vec<u8>> {
    let bytes = std::fs::read(path)
        .map_err(|e| Error::config(field, format!("cannot read {}: {e}", path.display())))?;
    let what = match kind {
        Kind::Certificates => "PEM certificate (-----BEGIN CERTIFICATE-----)",
        Kind::Key => "PEM private key (PKCS#8, PKCS#1 or SEC1: -----BEGIN ... PRIVATE KEY-----)",
    };
    if !pem_holds(&bytes, kind) {
        return Err(Error::config(
            field,
            format!("{} holds no {what}", path.display()),
        ));
    }
    Ok(bytes)
}

#[cfg(feature = "tls")]
fn pem_holds(bytes: &[u8], kind: Kind) -> bool {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    match kind {
        Kind::Certificates => {
            let certs: std::result::Result<Vec<_>, _> =
                CertificateDer::pem_slice_iter(bytes).collect();
            certs.is_ok_and(|c| !c.is_empty())
        }
        Kind::Key => PrivateKeyDer::from_pem_slice(bytes).is_ok(),
    }
}

#[cfg(not(feature = "tls"))]
fn pem_holds(bytes: &[u8], kind: Kind) -> bool {
    let text = String::from_utf8_lossy(bytes);
    match kind {
        Kind::Certificates => text.contains("-----BEGIN CERTIFICATE-----"),
        Kind::Key => text.contains("PRIVATE KEY-----"),
    }
}

/// The client certificate and key must belong together (rustls would refuse them at the
/// first connect, with a less helpful message).
#[cfg(feature = "tls")]
fn check_pair(cert: &[u8], key: &[u8], cert_path: &Path, key_path: &Path) -> Result<()> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let mismatch = |why: String| {
        Error::config(
            "tls_key_file",
            format!(
                "{} and the certificate {} cannot be used together: {why}",
                key_path.display(),
                cert_path.display()
            ),
        )
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert)
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| mismatch(e.to_string()))?;
    let key = PrivateKeyDer::from_pem_slice(key).map_err(|e| mismatch(e.to_string()))?;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let signing = provider
        .key_provider
        .load_private_key(key)
        .map_err(|e| mismatch(e.to_string()))?;
    rustls::sign::CertifiedKey::new(chain, signing)
        .keys_match()
        .map_err(|e| {
            let why = e.to_string();
            if why.contains("UnsupportedCertVersion") {
                Error::config(
                    "tls_cert_file",
                    format!(
                        "{} is an X.509 v1 certificate; TLS needs v3: issue it again with extensions (openssl x509 -req ... -extfile with extendedKeyUsage=clientAuth)",
                        cert_path.display()
                    ),
                )
            } else {
                mismatch(why)
            }
        })
}

#[cfg(not(feature = "tls"))]
fn check_pair(_: &[u8], _: &[u8], _: &Path, _: &Path) -> Result<()> {
    Ok(())
}

/// Installs rustls' `ring` provider as the process default unless one is installed already
/// (redis-rs builds its TLS configurations from the process default).
#[cfg(feature = "tls")]
pub(crate) fn install_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Another thread may have won the race: either way a provider is installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}
