//! The load benchmark's Redis: one server, and a 6-node cluster (3
//! masters with a replica each), started for the run on free ports in
//! the work directory and stopped with it. Without persistence: what is
//! measured is recall's storage path and the replica round trip, not a
//! disk.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Deployments {
    single: u16,
    cluster: Vec<u16>,
    children: Vec<Child>,
}

impl Deployments {
    /// `None` without redis-server and redis-cli on PATH.
    pub fn start() -> Option<Self> {
        let found = |bin: &str| {
            Command::new(bin)
                .arg("--version")
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        if !found("redis-server") || !found("redis-cli") {
            return None;
        }
        let ports = free_ports(7);
        let mut d = Self {
            single: ports[0],
            cluster: ports[1..].to_vec(),
            children: Vec::new(),
        };
        d.server(d.single, &[]);
        for &p in &d.cluster.clone() {
            d.server(
                p,
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "5000",
                ],
            );
        }
        let addrs: Vec<String> = d.cluster.iter().map(|p| format!("127.0.0.1:{p}")).collect();
        let created = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        assert!(created, "redis-cli --cluster create failed");
        d.wait_cluster();
        Some(d)
    }

    /// A `[storage]` section on the single server.
    pub fn single_storage(&self, prefix: &str) -> String {
        format!(
            "backend = \"redis\"\nurl = \"redis://127.0.0.1:{}\"\nkey_prefix = \"{prefix}\"\n",
            self.single
        )
    }

    /// A `[storage]` section on the cluster, waiting for `min_replicas`.
    pub fn cluster_storage(&self, prefix: &str, min_replicas: u32) -> String {
        let nodes: Vec<String> = self
            .cluster
            .iter()
            .map(|p| format!("127.0.0.1:{p}"))
            .collect();
        format!(
            "backend = \"redis\"\nurl = \"redis+cluster://{}\"\nkey_prefix = \"{prefix}\"\n\
             min_replicas = {min_replicas}\n",
            nodes.join(",")
        )
    }

    fn server(&mut self, port: u16, args: &[&str]) {
        let dir = super::work_dir().join(format!("redis-{port}"));
        std::fs::create_dir_all(&dir).expect("redis dir");
        let child = Command::new("redis-server")
            .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
            .args(["--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&dir)
            .args(args)
            .stdout(Stdio::null())
            .spawn()
            .expect("redis-server");
        self.children.push(child);
        let began = Instant::now();
        while cli(port, &["PING"]).trim() != "PONG" {
            assert!(
                began.elapsed() < Duration::from_secs(10),
                "redis-server :{port}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Until every node sees the cluster ok and every replica is linked.
    fn wait_cluster(&self) {
        let began = Instant::now();
        loop {
            let ready = self.cluster.iter().all(|&p| {
                let repl = cli(p, &["INFO", "replication"]);
                cli(p, &["CLUSTER", "INFO"]).contains("cluster_state:ok")
                    && (!repl.contains("role:slave") || repl.contains("master_link_status:up"))
            });
            if ready {
                return;
            }
            assert!(
                began.elapsed() < Duration::from_secs(30),
                "the cluster did not come up"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Deployments {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn cli(port: u16, args: &[&str]) -> String {
    Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

/// `n` free ports whose cluster bus ports (+10000) are free too.
fn free_ports(n: usize) -> Vec<u16> {
    let bindable = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
    let start = 20000 + (std::process::id() % 20000) as u16;
    let mut out = Vec::new();
    let mut p = start;
    while out.len() < n {
        if bindable(p) && bindable(p + 10000) {
            out.push(p);
        }
        p = if p >= 44999 { 20000 } else { p + 1 };
        assert!(p != start, "no free ports");
    }
    out
}
