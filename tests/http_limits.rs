//! Attacks on the HTTP server every endpoint of ours runs on (`gpushare::http`): a flood of
//! idle connections, a request whose body never comes, and running out of file descriptors.
//! The server must keep serving, close what it cannot afford, and never end.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::{get, post};
use std::sync::atomic::Ordering;

use gpushare::http::{ACCEPT_ERRORS, Limits, serve};

const LIMITS: Limits = Limits {
    max_connections: 16,
    header_timeout: Duration::from_secs(1),
    request_timeout: Duration::from_secs(2),
    connection_lifetime: Duration::from_secs(30),
    max_per_peer: 16,
};

fn router() -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route(
            "/echo",
            post(|body: String| async move { format!("{} bytes\n", body.len()) }),
        )
}

/// Starts the server on its own runtime thread; returns its address.
fn start() -> SocketAddr {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            tx.send(listener.local_addr().unwrap()).unwrap();
            serve(listener, router(), LIMITS, std::future::pending())
                .await
                .unwrap();
            panic!("the server ended");
        });
    });
    rx.recv().unwrap()
}

/// One request on a fresh connection: the status code, or None when the connection failed.
fn request(addr: SocketAddr, raw: &str) -> Option<u16> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    s.write_all(raw.as_bytes()).ok()?;
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.split_whitespace().nth(1)?.parse().ok()
}

fn healthz(addr: SocketAddr) -> Option<u16> {
    request(
        addr,
        "GET /healthz HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n",
    )
}

/// Retries `healthz` until it answers 200 or `within` passes.
fn serves_within(addr: SocketAddr, within: Duration) -> Option<Duration> {
    let t0 = Instant::now();
    while t0.elapsed() < within {
        if healthz(addr) == Some(200) {
            return Some(t0.elapsed());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

/// Whether the server has closed `s` (EOF), without waiting.
fn closed_by_server(mut s: &TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    match s.read(&mut b) {
        Ok(0) => true,
        Err(e) => e.kind() == std::io::ErrorKind::ConnectionReset,
        Ok(_) => false,
    }
}

#[test]
fn idle_flood_slow_body_and_fd_exhaustion() {
    let addr = start();
    assert_eq!(healthz(addr), Some(200));

    // 1,000 idle connections: at most 16 are held, the rest closed at once, and the held
    // ones are closed after the 1 s header deadline; the endpoint serves again meanwhile.
    let t0 = Instant::now();
    let idle: Vec<TcpStream> = (0..1000)
        .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok())
        .collect();
    eprintln!(
        "{} idle connections opened in {:?}",
        idle.len(),
        t0.elapsed()
    );
    assert!(idle.len() >= 900, "only {} connections opened", idle.len());
    std::thread::sleep(Duration::from_millis(300));
    let held = idle.iter().filter(|s| !closed_by_server(s)).count();
    eprintln!("after 300 ms the server holds {held} of them");
    assert!(
        held <= 16,
        "the server holds {held} idle connections (cap 16)"
    );
    let took = serves_within(addr, Duration::from_secs(5))
        .expect("the endpoint does not answer while 1,000 idle connections are open");
    eprintln!("healthz answered {took:?} into the flood");
    // The held ones go at the 1 s header deadline: waited for up to 5 s (a loaded host may
    // accept them late); only the 30 s connection lifetime would close them otherwise.
    let t1 = Instant::now();
    loop {
        let held = idle.iter().filter(|s| !closed_by_server(s)).count();
        if held == 0 {
            break;
        }
        assert!(
            t1.elapsed() < Duration::from_secs(5),
            "{held} idle connections outlive the header deadline"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!(
        "the held connections closed {:?} after the health check",
        t1.elapsed()
    );
    drop(idle);

    // Headers, then a body that never comes: 408 after the 2 s request deadline.
    let t0 = Instant::now();
    let code = request(
        addr,
        "POST /echo HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\nconnection: close\r\n\r\nabc",
    );
    eprintln!("slow body: {code:?} after {:?}", t0.elapsed());
    assert_eq!(code, Some(408));
    assert!(t0.elapsed() < Duration::from_secs(4));

    // Out of file descriptors: the accept loop survives EMFILE. Another process connects
    // while this one has no descriptor left to accept with.
    let mut connector = std::process::Command::new("bash")
        .args([
            "-c",
            &format!(
                "sleep 0.5; for i in $(seq 20); do exec {{fd}}<>/dev/tcp/127.0.0.1/{}; done; sleep 2",
                addr.port()
            ),
        ])
        .spawn()
        .unwrap();
    let errors_before = ACCEPT_ERRORS.load(Ordering::Relaxed);
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let open = std::fs::read_dir("/proc/self/fd").unwrap().count() as u64;
    setrlimit(Resource::RLIMIT_NOFILE, (open + 64).min(soft), hard).unwrap();
    let mut hog = vec![];
    while let Ok(f) = std::fs::File::open("/dev/null") {
        hog.push(f);
    }
    std::thread::sleep(Duration::from_millis(1500));
    drop(hog);
    setrlimit(Resource::RLIMIT_NOFILE, soft, hard).unwrap();
    let errors = ACCEPT_ERRORS.load(Ordering::Relaxed) - errors_before;
    let _ = connector.wait();
    eprintln!("{errors} accept errors while out of file descriptors");
    assert!(errors > 0, "the test did not exhaust the descriptors");
    assert!(
        serves_within(addr, Duration::from_secs(5)).is_some(),
        "the endpoint does not answer after running out of file descriptors"
    );
}

/// A throwaway CA with a server certificate for 127.0.0.1 and a client certificate it
/// signed, and a second CA with a client certificate of its own (openssl CLI).
fn pki(dir: &std::path::Path) {
    let script = format!(
        r#"set -e
cd {dir}
for ca in ca other; do
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout $ca.key -out $ca.crt -subj /CN=$ca -days 1 -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign
done
cert() {{ # NAME CA EKU [SAN]
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout $1.key -out $1.csr -subj /CN=$1
  printf 'basicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=%s\n%s\n' $3 "${{4:-}}" >$1.ext
  openssl x509 -req -in $1.csr -CA $2.crt -CAkey $2.key -CAcreateserial -out $1.crt -days 1 -extfile $1.ext
}}
cert server ca serverAuth subjectAltName=IP:127.0.0.1
cert client ca clientAuth
cert stranger other clientAuth
"#,
        dir = dir.display()
    );
    let out = std::process::Command::new("bash")
        .args(["-c", &script])
        .output()
        .expect("bash and openssl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `curl` the endpoint over TLS; the HTTP status, or None when the connection failed.
fn curl(dir: &std::path::Path, port: u16, client: Option<&str>) -> Option<u16> {
    curl_from(dir, port, client, "127.0.0.1")
}

/// [`curl`] from local address `from` (any of 127.0.0.0/8).
fn curl_from(dir: &std::path::Path, port: u16, client: Option<&str>, from: &str) -> Option<u16> {
    let mut cmd = std::process::Command::new("curl");
    cmd.args(["--interface", from]);
    cmd.args([
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        "%{http_code}",
        "--max-time",
        "5",
    ])
    .arg("--cacert")
    .arg(dir.join("ca.crt"));
    if let Some(c) = client {
        cmd.arg("--cert")
            .arg(dir.join(format!("{c}.crt")))
            .arg("--key")
            .arg(dir.join(format!("{c}.key")));
    }
    let out = cmd
        .arg(format!("https://127.0.0.1:{port}/healthz"))
        .output()
        .expect("curl");
    let code: u16 = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    (code != 0).then_some(code)
}

/// The throwaway PKI of [`pki`] in a new directory, and the server's mutual-TLS config.
fn pki_and_tls() -> (tempfile::TempDir, std::sync::Arc<rustls::ServerConfig>) {
    let dir = tempfile::tempdir().unwrap();
    pki(dir.path());
    let p = |n: &str| dir.path().join(n);
    let tls =
        gpushare::http::mtls_config(&p("server.crt"), &p("server.key"), &p("ca.crt")).unwrap();
    (dir, tls)
}

/// Starts the server over TLS on `ip`, port 0, on its own runtime thread; returns its port.
fn start_tls(ip: [u8; 4], limits: Limits, tls: std::sync::Arc<rustls::ServerConfig>) -> u16 {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            let listener = tokio::net::TcpListener::bind(SocketAddr::from((ip, 0)))
                .await
                .unwrap();
            tx.send(listener.local_addr().unwrap().port()).unwrap();
            gpushare::http::serve_tls(
                listener,
                router(),
                limits,
                Some(tls),
                std::future::pending(),
            )
            .await
            .unwrap();
        });
    });
    rx.recv().unwrap()
}

/// Connections that never authenticate (idle TCP, no TLS handshake) from one address take
/// at most `max_per_peer` places, and never the authenticated connections' own: a client
/// with its certificate, from another address, is served while they are held. Before, they
/// held every place until their handshake deadline, and were opened again.
#[test]
fn unauthenticated_connections_leave_room_for_authenticated_ones() {
    let (dir, tls) = pki_and_tls();
    let limits = Limits {
        max_connections: 4,
        max_per_peer: 2,
        header_timeout: Duration::from_secs(20),
        ..LIMITS
    };
    let port = start_tls([0, 0, 0, 0], limits, tls);
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let idle: Vec<TcpStream> = (0..10)
        .filter_map(|_| TcpStream::connect_timeout(&addr, Duration::from_secs(1)).ok())
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let held = idle.iter().filter(|s| !closed_by_server(s)).count();
    assert_eq!(
        held, 2,
        "idle connections from 127.0.0.1 held: {held} (2 per address)"
    );
    // The certified client, from 127.0.0.2 (loopback too), while the idle ones are held.
    assert_eq!(
        curl_from(dir.path(), port, Some("client"), "127.0.0.2"),
        Some(200)
    );
    drop(idle);
}

#[test]
fn mutual_tls_admits_only_clients_of_the_ca() {
    let (dir, tls) = pki_and_tls();
    let p = |n: &str| dir.path().join(n);
    let port = start_tls([127, 0, 0, 1], LIMITS, tls);
    assert_eq!(curl(dir.path(), port, Some("client")), Some(200));
    assert_eq!(curl(dir.path(), port, None), None, "no client certificate");
    assert_eq!(
        curl(dir.path(), port, Some("stranger")),
        None,
        "a client certificate of another CA"
    );
    // Plain HTTP on the TLS port gets nothing.
    assert_eq!(
        healthz(std::net::SocketAddr::from(([127, 0, 0, 1], port))),
        None
    );
    // A bad file names itself.
    let e = gpushare::http::mtls_config(&p("server.crt"), &p("server.key"), &p("missing.crt"))
        .unwrap_err()
        .to_string();
    assert!(
        e.starts_with(&format!("client CA {}: ", p("missing.crt").display())),
        "{e}"
    );
}
