//! Idle servers of a pool, kept per worker thread. A server's socket is
//! registered with the event loop of the worker that opened it; a client on
//! that worker that takes it is served by one thread, while one on another
//! worker makes two threads wake for every message. So a client first takes
//! the most recently used server of its own worker (LIFO, warm caches), and
//! only then one of another worker. `server_round_robin` takes the server
//! idle the longest instead, whatever its worker (FIFO), spreading load
//! over every server.

// Servers travel as `Box<ServerConn>` (idle stack, lease, hand-off to a
// waiter), so each of those moves copies a pointer, not the connection.
#![allow(clippy::vec_box)]

use super::server::ServerConn;

/// Per-worker LIFO stacks of idle servers.
#[derive(Debug, Default)]
pub struct IdleServers {
    stacks: Vec<Vec<Box<ServerConn>>>,
    len: usize,
}

impl IdleServers {
    pub fn len(&self) -> usize {
        self.len
    }

    /// Puts a server on its home worker's stack.
    pub fn push(&mut self, server: Box<ServerConn>) {
        let home = server.home_worker;
        if self.stacks.len() <= home {
            self.stacks.resize_with(home + 1, Vec::new);
        }
        self.stacks[home].push(server);
        self.len += 1;
    }

    /// The last server of `worker`'s stack, else of any other stack.
    pub fn pop_for(&mut self, worker: usize) -> Option<Box<ServerConn>> {
        let own = self.stacks.get_mut(worker).and_then(Vec::pop);
        let server = own.or_else(|| self.stacks.iter_mut().find_map(Vec::pop))?;
        self.len -= 1;
        Some(server)
    }

    /// The server idle the longest.
    pub fn remove_oldest(&mut self) -> Option<Box<ServerConn>> {
        let stack = self
            .stacks
            .iter_mut()
            .filter(|s| !s.is_empty())
            .min_by_key(|s| s[0].last_used)?;
        self.len -= 1;
        Some(stack.remove(0))
    }

    /// Removes and returns the servers for which `expired` holds, keeping
    /// at least `keep` servers in all.
    pub fn take_expired(
        &mut self,
        keep: usize,
        expired: impl Fn(&ServerConn) -> bool,
    ) -> Vec<Box<ServerConn>> {
        let mut out = Vec::new();
        for stack in &mut self.stacks {
            let mut i = 0;
            while i < stack.len() {
                if self.len > keep && expired(&stack[i]) {
                    out.push(stack.remove(i));
                    self.len -= 1;
                } else {
                    i += 1;
                }
            }
        }
        out
    }

    /// Visits every idle server.
    pub fn for_each(&self, mut f: impl FnMut(&ServerConn)) {
        self.stacks.iter().flatten().for_each(|s| f(s));
    }

    /// Removes all.
    pub fn drain(&mut self) -> Vec<Box<ServerConn>> {
        self.len = 0;
        self.stacks.iter_mut().flat_map(std::mem::take).collect()
    }
}
