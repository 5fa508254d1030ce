//! What decides a client's authentication besides auth_file: the hba rules
//! (`auth_type = hba`), the ident map (`map=` of cert and peer lines), and
//! the OS facts peer authentication needs. Loaded at startup (an error
//! stops it) and on RELOAD (an error keeps the old rules).

use std::ffi::CStr;

use sluice_config::{AuthType, Settings};

use super::hba::{Hba, HbaError, IdentMap, Method};

/// The rules in force.
#[derive(Debug, Default)]
pub struct AuthRules {
    /// Present when `auth_type = hba`.
    pub hba: Option<Hba>,
    pub ident: IdentMap,
}

impl AuthRules {
    pub fn load(s: &Settings) -> Result<Self, HbaError> {
        let hba = if s.auth_type == AuthType::Hba {
            let path = s.auth_hba_file.as_deref().ok_or_else(|| HbaError {
                path: "auth_hba_file".into(),
                line: 0,
                reason: "auth_type = hba needs auth_hba_file".into(),
            })?;
            Some(Hba::load(path)?)
        } else {
            None
        };
        let ident = match &s.auth_ident_file {
            Some(path) => IdentMap::load(path)?,
            None => IdentMap::default(),
        };
        Ok(Self { hba, ident })
    }

    /// Whether some client may log in with a TLS client certificate, so
    /// the handshake must ask for one.
    pub fn wants_client_certificates(&self, auth_type: AuthType) -> bool {
        auth_type == AuthType::Cert || self.hba.as_ref().is_some_and(|h| h.uses(Method::Cert))
    }
}

/// The name of OS user `uid`, for peer authentication.
pub fn os_user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0u8; 4096];
    // SAFETY: getpwuid_r writes into our buffers only; `result` is null or
    // points at `pwd`, whose strings live in `buf`, read before either goes.
    unsafe {
        let mut pwd: libc::passwd = std::mem::zeroed();
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = libc::getpwuid_r(
            uid,
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut result,
        );
        if rc != 0 || result.is_null() || pwd.pw_name.is_null() {
            return None;
        }
        CStr::from_ptr(pwd.pw_name).to_str().ok().map(str::to_owned)
    }
}

/// sluice's own effective OS user id.
pub fn own_uid() -> u32 {
    // SAFETY: a plain syscall without arguments.
    unsafe { libc::geteuid() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_uid_0() {
        assert_eq!(os_user_name(0).as_deref(), Some("root"));
    }
}
