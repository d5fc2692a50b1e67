//! A real `redis-server` (and a real 3-master Redis Cluster) on free
//! loopback ports, in a temporary directory, stopped on drop.
//!
//! Shared by the Redis tests and by the CLI's `fleet` demo, so the one way
//! the workspace starts Redis is written once.
//! Needs `redis-server` and `redis-cli` on `PATH` (`scripts/test.sh`
//! installs them when missing).

use std::collections::HashSet;
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

/// How long a server may take to answer PING after starting.
const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new Cluster may take to report `cluster_state:ok`.
const CLUSTER_TIMEOUT: Duration = Duration::from_secs(30);

static NEXT_DIR: AtomicU32 = AtomicU32::new(0);
/// Ports this process has handed out: two tests running at once never get
/// the same one, even if the kernel offers it twice.
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
/// Ports a new server tries before giving up, when another process took
/// the one it was given between `free_port` and its bind.
const START_ATTEMPTS: usize = 5;

/// A directory removed on drop.
#[derive(Debug)]
struct TempDir(PathBuf);

impl TempDir {
    fn new(what: &str) -> io::Result<TempDir> {
        let n = NEXT_DIR.fetch_add(1, Ordering::Relaxed);
        let path =
            std::env::temp_dir().join(format!("turnstile-{what}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path)?;
        Ok(TempDir(path))
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One `redis-server` child process on `127.0.0.1:port`.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    extra_args: Vec<String>,
    dir: TempDir,
}

/// A loopback port that is free now, whose cluster bus port (`+10000`) is
/// free too, and that this process has not handed out before.
pub fn free_port() -> io::Result<u16> {
    for _ in 0..100 {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
        let port = listener.local_addr()?.port();
        if port > 55_000 {
            continue;
        }
        if TcpListener::bind((Ipv4Addr::LOCALHOST, port + 10_000)).is_err() {
            continue;
        }
        let mut handed_out = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        if handed_out.get_or_insert_with(HashSet::new).insert(port) {
            return Ok(port);
        }
    }
    Err(io::Error::other("no free loopback port pair found"))
}

impl RedisServer {
    /// Starts a server on a free port and waits for its PONG.
    pub fn start() -> io::Result<RedisServer> {
        Self::start_with(Vec::new())
    }

    /// A port that is free when chosen may be taken before the server binds
    /// it (by another process's server, or a client's ephemeral port): then
    /// the server exits, and another port is tried.
    fn start_with(extra_args: Vec<String>) -> io::Result<RedisServer> {
        let mut server = RedisServer {
            port: free_port()?,
            child: None,
            extra_args,
            dir: TempDir::new("redis")?,
        };
        let mut attempts = 1;
        loop {
            match server.restart() {
                Err(e) if e.kind() == io::ErrorKind::AddrInUse && attempts < START_ATTEMPTS => {
                    attempts += 1;
                    server.port = free_port()?;
                }
                result => return result.map(|()| server),
            }
        }
    }

    /// `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// The port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Kills the server (SIGKILL: no goodbye to its clients) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts the server again on the same port (after [`kill`](Self::kill)).
    ///
    /// It is ready when a PING on the port is answered by this very process
    /// (`INFO server`'s `process_id`): a PONG from another test's server on
    /// the same port would let this one's tests talk to, and be killed
    /// with, a server they do not own. If the port is taken, the server
    /// exits and the error's kind is `AddrInUse`.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        let log = std::fs::File::create(self.dir.0.join(format!("redis-{}.log", self.port)))?;
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(&self.dir.0)
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(log.try_clone()?))
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!(
                        "cannot run redis-server ({e}): install it (apt-get install redis-server)"
                    ),
                )
            })?;
        let pid = child.id();
        self.child = Some(child);
        let deadline = Instant::now() + START_TIMEOUT;
        while Instant::now() < deadline {
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                self.child = None;
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!(
                        "redis-server on port {} exited at start ({status}); is the port taken?",
                        self.port
                    ),
                ));
            }
            if ping(self.port).is_ok() && server_pid(self.port).ok() == Some(pid) {
                return Ok(());
            }
            thread::sleep(Duration::from_millis(20));
        }
        Err(io::Error::other(format!(
            "redis-server on port {} did not answer PING in {START_TIMEOUT:?}",
            self.port
        )))
    }

    /// Sends a signal by name (`STOP`, `CONT`) to the server.
    pub fn signal(&self, name: &str) -> io::Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| io::Error::other("the server is not running"))?;
        let status = Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!("kill -{name} {pid} failed")))
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        // A stopped server ignores SIGKILL only until continued: continue
        // it first so kill() never waits on it.
        let _ = self.signal("CONT");
        self.kill();
    }
}

/// `PING` over a raw socket: `Ok` on `+PONG`.
pub fn ping(port: u16) -> io::Result<()> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    stream.write_all(b"PING\r\n")?;
    let mut reply = [0u8; 7];
    stream.read_exact(&mut reply)?;
    if &reply == b"+PONG\r\n" {
        Ok(())
    } else {
        Err(io::Error::other("unexpected reply to PING"))
    }
}

/// The process id of the server answering on `port` (`INFO server`).
fn server_pid(port: u16) -> io::Result<u32> {
    let mut stream = TcpStream::connect((Ipv4Addr::LOCALHOST, port))?;
    stream.set_read_timeout(Some(Duration::from_millis(500)))?;
    stream.write_all(b"INFO server\r\n")?;
    // A bulk string holding `process_id:<pid>\r\n` among other lines: read
    // until that line is whole.
    let mut reply = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let text = String::from_utf8_lossy(&reply);
        if let Some((_, rest)) = text.split_once("process_id:") {
            if let Some((pid, _)) = rest.split_once("\r\n") {
                return pid
                    .parse()
                    .map_err(|e| io::Error::other(format!("process_id on port {port}: {e}")));
            }
        }
        let read = stream.read(&mut chunk)?;
        if read == 0 {
            return Err(io::Error::other(format!("no process_id from port {port}")));
        }
        reply.extend_from_slice(&chunk[..read]);
    }
}

/// Three masters, no replicas, all slots covered: a real Redis Cluster.
#[derive(Debug)]
pub struct RedisCluster {
    servers: Vec<RedisServer>,
}

impl RedisCluster {
    /// Starts three cluster-enabled servers, joins them with `redis-cli
    /// --cluster create`, and waits until every node says
    /// `cluster_state:ok`.
    pub fn start() -> io::Result<RedisCluster> {
        let mut servers = Vec::new();
        for _ in 0..3 {
            let dir_hint = servers.len();
            servers.push(RedisServer::start_with(vec![
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-config-file".into(),
                format!("nodes-{dir_hint}-{}.conf", std::process::id()),
                "--cluster-node-timeout".into(),
                "5000".into(),
            ])?);
        }
        let nodes: Vec<String> = servers
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port()))
            .collect();
        let output = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()?;
        if !output.status.success() {
            return Err(io::Error::other(format!(
                "redis-cli --cluster create failed: {}",
                String::from_utf8_lossy(&output.stdout)
            )));
        }
        let cluster = RedisCluster { servers };
        let deadline = Instant::now() + CLUSTER_TIMEOUT;
        while Instant::now() < deadline {
            if cluster.servers.iter().all(|s| cluster_ok(s.port())) {
                return Ok(cluster);
            }
            thread::sleep(Duration::from_millis(100));
        }
        Err(io::Error::other(
            "the cluster did not reach cluster_state:ok",
        ))
    }

    /// `redis://127.0.0.1:port` of each master.
    pub fn urls(&self) -> Vec<String> {
        self.servers.iter().map(RedisServer::url).collect()
    }

    /// The masters' ports.
    pub fn ports(&self) -> Vec<u16> {
        self.servers.iter().map(RedisServer::port).collect()
    }
}

fn cluster_ok(port: u16) -> bool {
    Command::new("redis-cli")
        .args(["-p", &port.to_string(), "cluster", "info"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("cluster_state:ok"))
        .unwrap_or(false)
}

/// Runs `redis-cli -p port ARGS...` and returns its stdout.
pub fn redis_cli(port: u16, args: &[&str]) -> io::Result<String> {
    let output = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// How many keys the server at `port` holds (`DBSIZE`).
pub fn db_size(port: u16) -> io::Result<u64> {
    redis_cli(port, &["DBSIZE"])?
        .trim()
        .parse()
        .map_err(|e| io::Error::other(format!("DBSIZE on port {port}: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The clash that made another test's server answer this one's PING
    /// (and its kill end this one's Redis mid-test): a server started on a
    /// port another server holds is refused, and `start` moves on to
    /// another port.
    #[test]
    fn a_server_never_takes_another_servers_port_for_its_own() {
        let first = RedisServer::start().expect("redis-server");
        let mut clash = RedisServer {
            port: first.port(),
            child: None,
            extra_args: Vec::new(),
            dir: TempDir::new("redis-clash").expect("temp dir"),
        };
        let refused = clash.restart().expect_err("started on a taken port");
        assert_eq!(refused.kind(), io::ErrorKind::AddrInUse, "{refused}");
        assert_eq!(clash.pid(), None);

        let second = RedisServer::start().expect("redis-server");
        assert_ne!(second.port(), first.port());
        assert_eq!(server_pid(second.port()).ok(), second.pid());
        assert_eq!(server_pid(first.port()).ok(), first.pid());
    }
}
