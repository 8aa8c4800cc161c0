//! HTTPS: the certificate chain and key from PEM files, as a rustls acceptor (ring,
//! the one crypto provider of the workspace). Both planes ride on it: the control
//! plane's requests and the data plane's upgraded agent streams.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

use crate::config::TlsFiles;

/// Why HTTPS cannot be served.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file is missing, unreadable or not PEM.
    #[error("Cannot read {what} from {}", path.display())]
    Read {
        /// `the certificate chain` or `the private key`.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// What the PEM reader said.
        #[source]
        error: rustls::pki_types::pem::Error,
    },
    /// The certificate file holds no certificate.
    #[error("No certificate in {}", .0.display())]
    NoCertificate(PathBuf),
    /// rustls refused the pair (a key that does not match, an unsupported key type).
    #[error("The certificate and key cannot be used")]
    Config(#[source] rustls::Error),
}

/// The acceptor for `files`.
pub fn acceptor(files: &TlsFiles) -> Result<TlsAcceptor, TlsError> {
    let certs = certificates(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key).map_err(|error| TlsError::Read {
        what: "the private key",
        path: files.key.clone(),
        error,
    })?;
    // The provider is named here rather than installed process-wide, so that another
    // rustls user in the process cannot make this panic.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(TlsError::Config)?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

fn certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let read = |error| TlsError::Read {
        what: "the certificate chain",
        path: path.to_owned(),
        error,
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(read)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(read)?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.to_owned()));
    }
    Ok(certs)
}
