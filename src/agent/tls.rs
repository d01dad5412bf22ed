//! `--tls-cert`/`--tls-key`: the agent's certificate, swapped in place on
//! SIGHUP. The rustls configuration is built once and asks a resolver for
//! the certificate at each handshake, so a reload touches nothing but one
//! `Arc`: connections already open keep the certificate they began with.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use anyhow::Context;
use rustls::ServerConfig;
use rustls::crypto::CryptoProvider;
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

#[derive(Debug)]
pub struct Tls {
    cert: PathBuf,
    key: PathBuf,
    provider: Arc<CryptoProvider>,
    current: RwLock<Arc<CertifiedKey>>,
}

fn load(cert: &Path, key: &Path, provider: &CryptoProvider) -> anyhow::Result<CertifiedKey> {
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("--tls-cert {}: cannot read PEM certificates", cert.display()))?;
    anyhow::ensure!(!chain.is_empty(), "--tls-cert {}: no CERTIFICATE in it", cert.display());
    // The key's bytes are never shown: only which file failed.
    let der = PrivateKeyDer::from_pem_file(key).map_err(|_| anyhow::anyhow!("--tls-key {}: no PEM private key in it", key.display()))?;
    CertifiedKey::from_der(chain, der, provider).map_err(|e| anyhow::anyhow!("--tls-key {} does not fit --tls-cert {}: {e}", key.display(), cert.display()))
}

impl Tls {
    pub fn load(cert: PathBuf, key: PathBuf) -> anyhow::Result<Arc<Tls>> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let current = RwLock::new(Arc::new(load(&cert, &key, &provider)?));
        Ok(Arc::new(Tls { cert, key, provider, current }))
    }

    /// Reads both files again; on error the certificate in force stays.
    pub fn reload(&self) -> anyhow::Result<()> {
        let fresh = Arc::new(load(&self.cert, &self.key, &self.provider)?);
        *self.current.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(())
    }

    pub fn server_config(self: &Arc<Self>) -> anyhow::Result<Arc<ServerConfig>> {
        let mut config = ServerConfig::builder_with_provider(self.provider.clone())
            .with_safe_default_protocol_versions()
            .context("TLS")?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(Resolver(self.clone())));
        // No resumption: a resumed session skips the resolver, so a client
        // would go on seeing the certificate a reload replaced. A scraper
        // connects every few seconds at most; a full handshake is cheap.
        config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
        config.send_tls13_tickets = 0;
        Ok(Arc::new(config))
    }
}

#[derive(Debug)]
struct Resolver(Arc<Tls>);

impl ResolvesServerCert for Resolver {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current.read().unwrap_or_else(|p| p.into_inner()).clone())
    }
}
