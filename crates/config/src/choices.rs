//! The settings whose value is one word out of a closed set (pool modes,
//! authentication methods, runtime layouts, host selection). Each type knows
//! its spelling in pgbouncer.ini, so reading and SHOW CONFIG agree.

use std::fmt;
use std::str::FromStr;

/// A word that is not one of the allowed spellings of a choice.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("expected one of {}", self.expected_list())]
pub struct UnknownChoice {
    /// The allowed spellings, each followed by ", " (see `expected_list`).
    pub expected: &'static str,
}

/// Declares a fieldless enum together with its ini spellings: `as_str`,
/// `Display`, and a case-insensitive `FromStr`. Extra accepted spellings
/// (aliases) may follow a variant's main one.
macro_rules! named_choices {
    (
        $(#[$meta:meta])*
        $name:ident {
            $( $(#[$vmeta:meta])* $variant:ident = $spelling:literal $(| $alias:literal)* ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            /// The spelling used in pgbouncer.ini and SHOW CONFIG.
            pub fn as_str(self) -> &'static str {
                match self {
                    $( $name::$variant => $spelling, )+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = UnknownChoice;

            fn from_str(text: &str) -> Result<Self, Self::Err> {
                let word = text.trim();
                $(
                    if word.eq_ignore_ascii_case($spelling)
                        $(|| word.eq_ignore_ascii_case($alias))*
                    {
                        return Ok($name::$variant);
                    }
                )+
                Err(UnknownChoice {
                    expected: concat!($($spelling, ", "),+),
                })
            }
        }
    };
}

named_choices! {
    /// When a server connection goes back to the pool.
    PoolMode {
        /// After the client disconnects.
        Session = "session",
        /// After each transaction.
        Transaction = "transaction",
        /// After each statement; multi-statement transactions are refused.
        Statement = "statement",
    }
}

named_choices! {
    /// How clients prove who they are (`auth_type`).
    AuthType {
        /// No check; the user name is ignored (admin console open to all).
        Any = "any",
        /// No password check, but the user must be known.
        Trust = "trust",
        /// Clear-text password.
        Plain = "plain",
        /// MD5 challenge (SCRAM is used when the stored secret is SCRAM).
        Md5 = "md5",
        /// SCRAM-SHA-256.
        ScramSha256 = "scram-sha-256",
        /// TLS client certificate.
        Cert = "cert",
        /// Per-connection method from `auth_hba_file`.
        Hba = "hba",
        /// PAM.
        Pam = "pam",
        /// LDAP, configured by `auth_ldap_options`.
        Ldap = "ldap",
    }
}

named_choices! {
    /// How sluice lays out its async runtime (`[sluice] runtime`).
    RuntimeKind {
        /// One multi-threaded runtime shared by all workers.
        Shared = "shared",
        /// One single-threaded runtime per worker, each with its own listener.
        PerCore = "per_core" | "per-core" | "percore",
    }
}

named_choices! {
    /// How sluice's workers send (`[sluice] io_backend`).
    IoBackend {
        /// io_uring where the kernel allows it, else epoll.
        Auto = "auto",
        /// One `sendto` per message, readiness from epoll (tokio).
        Epoll = "epoll",
        /// Sends batched through a per-worker io_uring; sluice does not
        /// start without it.
        IoUring = "io_uring" | "io-uring" | "uring",
    }
}

named_choices! {
    /// What transaction and statement mode do with session objects a
    /// client leaves on its server (temporary tables, WITH HOLD cursors,
    /// session advisory locks).
    SessionObjects {
        /// The client keeps its server until the objects are gone.
        Pin = "pin",
        /// The objects are removed when the transaction ends.
        Discard = "discard",
    }
}

named_choices! {
    /// Whether a client's reads wait for replicas to have its writes
    /// (`[sluice] read_your_writes`).
    ReadYourWrites {
        /// After a client's write transaction, its reads go only to a
        /// replica that has replayed past it (else to the primary).
        Session = "session",
        /// Every read goes only to a replica that has replayed every
        /// transaction that may have written and ended on the primary
        /// before the read began, whichever client of the database entry
        /// ran it (else to the primary).
        Database = "database",
        /// Reads go to any replica within the lag limits.
        Off = "off",
    }
}

named_choices! {
    /// Which entry of a comma-separated `host` list a new server
    /// connection uses (`load_balance_hosts` in `[databases]`).
    LoadBalanceHosts {
        /// Each new connection takes the next host.
        RoundRobin = "round-robin",
        /// Stay on one host until a connection to it fails.
        Disable = "disable",
    }
}

impl UnknownChoice {
    /// The allowed spellings without the trailing separator.
    pub fn expected_list(&self) -> &'static str {
        self.expected.trim_end_matches(", ")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_round_trip() {
        for mode in PoolMode::ALL {
            assert_eq!(mode.as_str().parse::<PoolMode>(), Ok(*mode));
        }
        for auth in AuthType::ALL {
            assert_eq!(auth.to_string().parse::<AuthType>(), Ok(*auth));
        }
        assert_eq!("per-core".parse::<RuntimeKind>(), Ok(RuntimeKind::PerCore));
        assert_eq!(
            "SCRAM-SHA-256".parse::<AuthType>(),
            Ok(AuthType::ScramSha256)
        );
    }

    #[test]
    fn unknown_word_lists_choices() {
        let err = "sessions".parse::<PoolMode>().unwrap_err();
        assert_eq!(err.expected_list(), "session, transaction, statement");
    }
}
