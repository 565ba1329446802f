//! A throw-away PKI for the TLS tests: CAs, server and client certificates (good, expired,
//! signed by the wrong CA), written as PEM files.

use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, date_time_ymd,
};

/// A CA that can sign leaves.
pub struct Ca {
    issuer: CertifiedIssuer<'static, KeyPair>,
    /// Its certificate as PEM.
    pub pem: String,
}

impl Ca {
    /// A new self-signed CA.
    pub fn new(name: &str) -> Ca {
        let mut p = CertificateParams::new(Vec::<String>::new()).expect("params");
        p.distinguished_name.push(DnType::CommonName, name);
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let issuer =
            CertifiedIssuer::self_signed(p, KeyPair::generate().expect("key")).expect("ca");
        let pem = issuer.pem();
        Ca { issuer, pem }
    }

    /// Write the CA certificate to `dir/<file>`.
    pub fn write(&self, dir: &Path, file: &str) -> PathBuf {
        let p = dir.join(file);
        std::fs::write(&p, &self.pem).expect("write ca");
        p
    }

    /// Sign a leaf for these names (server: localhost + 127.0.0.1; client: a CN), optionally
    /// already expired. Returns (cert path, key path) under `dir` named `stem`.
    pub fn leaf(&self, dir: &Path, stem: &str, client: bool, expired: bool) -> (PathBuf, PathBuf) {
        let names = if client {
            Vec::new()
        } else {
            vec!["localhost".to_owned(), "127.0.0.1".to_owned()]
        };
        let mut p = CertificateParams::new(names).expect("params");
        p.distinguished_name.push(DnType::CommonName, stem);
        p.extended_key_usages = vec![if client {
            ExtendedKeyUsagePurpose::ClientAuth
        } else {
            ExtendedKeyUsagePurpose::ServerAuth
        }];
        if expired {
            p.not_before = date_time_ymd(2020, 1, 1);
            p.not_after = date_time_ymd(2021, 1, 1);
        }
        let key = KeyPair::generate().expect("key");
        let cert = p.signed_by(&key, &self.issuer).expect("sign");
        let (c, k) = (
            dir.join(format!("{stem}.crt")),
            dir.join(format!("{stem}.key")),
        );
        std::fs::write(&c, cert.pem()).expect("write cert");
        std::fs::write(&k, key.serialize_pem()).expect("write key");
        (c, k)
    }
}
