//! Certificates for TLS tests, made at run time with Debian's `openssl`
//! CLI: a CA, a server certificate for `localhost` / 127.0.0.1, a client
//! certificate whose CN is a user name, a second server certificate for
//! the same names (`server2.*`, for swaps), a server certificate for
//! another name (`wrongname.*`), and a second CA that signed nothing (for
//! verification failures). EC P-256 keys: fast
//! to make.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::scratch::ScratchDir;

/// PEM files in their own scratch directory, removed on drop.
#[derive(Debug)]
pub struct Certs {
    dir: ScratchDir,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (Debian package openssl)");
    assert!(
        out.status.success(),
        "openssl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn make_ca(dir: &Path, name: &str) {
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.crt"),
            "-days",
            "3",
            "-subj",
            &format!("/CN=sluice test {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    );
}

fn make_leaf(dir: &Path, ca: &str, name: &str, cn: &str, ext: &str) {
    openssl(
        dir,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={cn}"),
        ],
    );
    std::fs::write(dir.join(format!("{name}.ext")), ext).expect("write ext");
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &format!("{name}.csr"),
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-extfile",
            &format!("{name}.ext"),
        ],
    );
}

impl Certs {
    /// A CA with a server certificate (`server.*`) and a client certificate
    /// for `client_user` (`client.*`); `other-ca.crt` signed neither.
    pub fn make(client_user: &str) -> Certs {
        let dir = ScratchDir::create();
        let d = dir.path();
        make_ca(d, "ca");
        make_ca(d, "other-ca");
        let server_ext = |names: &str| {
            format!(
                "subjectAltName={names}\nbasicConstraints=CA:FALSE\n\
                 keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
            )
        };
        let localhost = server_ext("DNS:localhost,IP:127.0.0.1");
        make_leaf(d, "ca", "server", "localhost", &localhost);
        make_leaf(d, "ca", "server2", "localhost", &localhost);
        make_leaf(
            d,
            "ca",
            "wrongname",
            "elsewhere.example",
            &server_ext("DNS:elsewhere.example"),
        );
        make_leaf(
            d,
            "ca",
            "client",
            client_user,
            "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n\
             extendedKeyUsage=clientAuth\n",
        );
        // libpq refuses a key file others can read.
        for key in ["server.key", "server2.key", "wrongname.key", "client.key"] {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(d.join(key), std::fs::Permissions::from_mode(0o600))
                .expect("chmod key");
        }
        Certs { dir }
    }

    /// `<name>` in the directory, e.g. `ca.crt`, `server.key`.
    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The text of `<name>` (to hand a certificate to the testkit).
    pub fn text(&self, name: &str) -> String {
        std::fs::read_to_string(self.file(name)).expect("read certificate file")
    }

    /// Same, as a string for an ini value or a conninfo.
    pub fn path(&self, name: &str) -> String {
        self.file(name).display().to_string()
    }
}
