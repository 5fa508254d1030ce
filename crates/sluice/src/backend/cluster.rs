//! One database that routes reads or takes its hosts from Patroni: its
//! topology (what the checks know of each host) and the pools of its
//! single hosts, one per host and server user. The clients' own pool of
//! the database (one per user, kept by `App`) follows the primary; a read
//! routed to a replica runs on that replica's pool here. A cluster is
//! replaced whole when a RELOAD changes its hosts, Patroni or routing:
//! the old one is retired, its pools drain, and nothing new is opened
//! through it by a client that still holds it.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::pool::Pool;
use super::target::ServerAddr;
use super::topology::Topology;

pub struct Cluster {
    pub topology: Arc<Topology>,
    /// Pools of single hosts, by (server user, host index).
    hosts: Mutex<HashMap<(String, usize), Arc<Pool>>>,
    retired: AtomicBool,
}

impl Cluster {
    pub fn new(topology: Topology) -> Self {
        Self {
            topology: Arc::new(topology),
            hosts: Mutex::new(HashMap::new()),
            retired: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, usize), Arc<Pool>>> {
        self.hosts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Forgets the login failure the pool of host `index` for `user` keeps.
    pub fn forget_login_failure(&self, user: &str, index: usize) {
        if let Some(pool) = self.lock().get(&(user.to_owned(), index)) {
            pool.forget_login_failure();
        }
    }

    /// The pool of host `index` for server user `user`, made by `open`
    /// (given the host's address) on first use. `None`: no such host, or
    /// the cluster was retired.
    pub fn host_pool(
        &self,
        user: &str,
        index: usize,
        open: impl FnOnce(ServerAddr) -> Option<Pool>,
    ) -> Option<Arc<Pool>> {
        let mut pools = self.lock();
        if self.retired.load(Ordering::Acquire) {
            return None;
        }
        let key = (user.to_owned(), index);
        if let Some(p) = pools.get(&key) {
            return Some(p.clone());
        }
        let addr = self.topology.hosts().get(index)?.addr.clone();
        let pool = Arc::new(open(addr)?.for_host(index));
        pool.join_limits(&pool);
        pools.insert(key, pool.clone());
        Some(pool)
    }

    /// Every host pool (SHOW POOLS, SHOW SERVERS, RELOAD, /metrics).
    pub fn pools(&self) -> Vec<Arc<Pool>> {
        self.lock().values().cloned().collect()
    }

    /// Hosts `which` now have other addresses (a new Patroni member took
    /// their places): their pools point there, and close the servers
    /// they had open on the old ones.
    pub fn readdress(&self, which: &[usize]) {
        let hosts = self.topology.hosts();
        for ((_, i), pool) in self.lock().iter() {
            if which.contains(i)
                && let Some(h) = hosts.get(*i)
            {
                pool.retarget(&h.addr);
            }
        }
    }

    /// Out of use (RELOAD replaced it): idle servers close now, busy ones
    /// when they come back, and no pool is made through it again.
    pub fn retire(&self) {
        let pools = self.lock();
        self.retired.store(true, Ordering::Release);
        for pool in pools.values() {
            pool.retire();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn tcp(port: u16) -> ServerAddr {
        ServerAddr::Tcp {
            host: "127.0.0.1".into(),
            port,
        }
    }

    /// A pool that never opens a server (none is asked for).
    fn pool(addr: ServerAddr) -> Option<Pool> {
        Some(crate::backend::pool::tests::test_pool(
            addr,
            1,
            Duration::from_secs(1),
        ))
    }

    #[test]
    fn one_pool_per_host_and_user_until_retired() {
        let c = Cluster::new(Topology::new("db".into(), vec![tcp(1), tcp(2)], Vec::new()));
        let a = c.host_pool("u", 1, pool).expect("host 1");
        assert_eq!((a.host, a.addr()), (2, tcp(2)));
        let again = c.host_pool("u", 1, |_| panic!("made twice")).expect("kept");
        assert!(Arc::ptr_eq(&a, &again));
        let other_user = c.host_pool("v", 1, pool).expect("another user's");
        assert!(!Arc::ptr_eq(&a, &other_user));
        assert!(c.host_pool("u", 2, pool).is_none(), "no third host");
        assert_eq!(c.pools().len(), 2);
        c.retire();
        assert!(c.host_pool("u", 1, pool).is_none(), "retired");
        assert!(c.host_pool("u", 0, pool).is_none(), "retired");
    }

    #[test]
    fn a_place_a_new_member_took_moves_its_pools() {
        use crate::backend::topology::{MAX_HOSTS, Member};
        let c = Cluster::new(Topology::new("db".into(), Vec::new(), vec!["x:1".into()]));
        let member = |port: u16| Member {
            name: format!("m{port}"),
            role: "replica".into(),
            state: "streaming".into(),
            host: "127.0.0.1".into(),
            port,
        };
        let mut all: Vec<Member> = (0..MAX_HOSTS as u16).map(|p| member(100 + p)).collect();
        c.topology.follow_members(&all);
        let p = c.host_pool("u", 3, pool).expect("host 3");
        assert_eq!(p.addr(), tcp(103));
        all.remove(3);
        all.push(member(9));
        let news = c.topology.follow_members(&all);
        assert_eq!(news.readdressed, vec![3]);
        c.readdress(&news.readdressed);
        assert_eq!(p.addr(), tcp(9));
    }
}
