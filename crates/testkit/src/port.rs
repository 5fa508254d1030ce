//! Picking TCP ports for clusters. The kernel hands out a free port when we
//! bind port 0; a process-wide set makes sure two clusters started by the
//! same process never get the same one. Another process can still grab it
//! before the server binds, so cluster startup retries on "address in use".

use std::collections::HashSet;
use std::net::{Ipv4Addr, TcpListener};
use std::sync::{Mutex, PoisonError};

use crate::error::TestkitError;

/// A currently free TCP port on 127.0.0.1, not handed out before by this process.
pub fn free_port() -> Result<u16, TestkitError> {
    static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    for _ in 0..100 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| TestkitError::io("binding 127.0.0.1:0 to find a free port", e))?;
        let port = listener
            .local_addr()
            .map_err(|e| TestkitError::io("reading the address of a bound socket", e))?
            .port();
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(PoisonError::into_inner);
        if handed_out.get_or_insert_with(HashSet::new).insert(port) {
            return Ok(port);
        }
    }
    Err(TestkitError::InvalidArgument(
        "could not find a free port not already used by this process".to_owned(),
    ))
}
