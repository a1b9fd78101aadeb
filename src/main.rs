use std::path::PathBuf;
use std::process::ExitCode;

use recall::config::{Config, LogFormat};
use tracing_subscriber::EnvFilter;

// Many small, short-lived allocations per request (JSON, headers, chunks)
// and long-lived message text side by side: mimalloc keeps both cheaper
// and less fragmented than the system allocator. Its `no_thp` feature
// (Cargo.toml) and `no_huge_pages` keep its arena out of 2 MiB pages a
// session store fills only in part.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "\
recall: an OpenAI-compatible proxy that gives AI agents short-term memory

usage: recall [--config PATH]          start the proxy
       recall check [--config PATH]    validate a config and print it (secrets masked)
       recall --version | --help

  --config PATH   config file (default: $RECALL_CONFIG, else config/recall.toml)

environment: RECALL_CONFIG, RECALL_LISTEN (server.listen), RECALL_STORAGE_PATH (storage.path),
             RUST_LOG (log filter), and the variables your config names (API keys, tokens)";

enum Command {
    Serve(PathBuf),
    Check(PathBuf),
    Version,
}

fn command() -> Result<Command, String> {
    let mut args = std::env::args().skip(1).peekable();
    let check = args.peek().is_some_and(|a| a == "check");
    if check {
        args.next();
    }
    let mut path = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--config" | "-c" => {
                path = Some(args.next().ok_or("--config needs a path")?);
            }
            s if s.starts_with("--config=") => path = Some(s["--config=".len()..].to_owned()),
            "--help" | "-h" => return Err(String::new()),
            "--version" | "-V" => return Ok(Command::Version),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let path: PathBuf = path
        .or_else(|| std::env::var("RECALL_CONFIG").ok())
        .unwrap_or_else(|| "config/recall.toml".into())
        .into();
    Ok(if check {
        Command::Check(path)
    } else {
        Command::Serve(path)
    })
}

fn init_logging(config: &Config) {
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(&config.log.level))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    match config.log.format {
        LogFormat::Json => builder.json().init(),
        LogFormat::Text => builder.init(),
    }
}

/// "name [vendor] models -> base_url" for each upstream, for the start-up
/// line; a mock upstream also says where it runs and at what pace.
fn config_summary(app: &recall::App) -> Vec<String> {
    app.config
        .upstreams
        .iter()
        .zip(app.upstreams.iter())
        .map(|(c, u)| {
            let mut line = format!(
                "{} [{}] {} -> {}",
                c.name,
                c.vendor.as_str(),
                c.models.join(","),
                c.base_url
            );
            if let Some(mock) = u.mock() {
                let pace = mock.pace();
                let words = match pace.words_per_chunk {
                    1 => "1 word".to_owned(),
                    n => format!("{n} words"),
                };
                line.push_str(&format!(
                    " (built in, no network: served at {}, streaming {words} every {} ms)",
                    u.base_url(),
                    pace.chunk_delay.as_millis()
                ));
            }
            line
        })
        .collect()
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! { _ = ctrl_c => {}, _ = term => {} }
}

/// Transparent huge pages off for this process, unless
/// `MIMALLOC_ALLOW_THP` is set (then mimalloc and the host decide).
/// mimalloc's `no_thp` only stops it asking for them, which is enough on
/// hosts in `madvise` mode, not on those in `always` mode; this is what
/// `MIMALLOC_ALLOW_THP=0` does, as the default (docs/perf-journal.md item 45).
fn no_huge_pages() {
    #[cfg(target_os = "linux")]
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_none() {
        // SAFETY: prctl with integer arguments only; it reads and writes
        // no memory of ours. A kernel without it changes nothing.
        let _ = unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) };
    }
}

fn main() -> ExitCode {
    no_huge_pages();
    let (path, check) = match command() {
        Ok(Command::Version) => {
            println!("recall {}", env!("CARGO_PKG_VERSION"));
            return ExitCode::SUCCESS;
        }
        Ok(Command::Serve(p)) => (p, false),
        Ok(Command::Check(p)) => (p, true),
        Err(e) => {
            if e.is_empty() {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            eprintln!("recall: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let config = match Config::load(&path).and_then(|c| c.check_files(&path).map(|()| c)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("recall: {e}");
            return ExitCode::from(2);
        }
    };
    if check {
        println!("# {} is valid; the effective config:\n", path.display());
        println!("{}", config.masked_toml());
        return ExitCode::SUCCESS;
    }
    // The first serving thread's runtime; `recall::serve` starts the
    // others, each with a runtime of its own (see `recall::server::threads`).
    match recall::server::threads::runtime(0) {
        // Spawned, so that serving runs on the runtime's worker thread
        // rather than on this one, which only waits.
        Ok(rt) => rt.block_on(async {
            tokio::spawn(serve(config, path)).await.unwrap_or_else(|e| {
                eprintln!("recall: {e}");
                ExitCode::from(1)
            })
        }),
        Err(e) => {
            eprintln!("recall: cannot start the runtime: {e}");
            ExitCode::from(1)
        }
    }
}

async fn serve(config: Config, path: PathBuf) -> ExitCode {
    init_logging(&config);
    let addr = config.server.listen.clone();
    let app = match recall::App::new(config).await {
        Ok(app) => app,
        Err(e) => {
            eprintln!("recall: {e}");
            return ExitCode::from(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(&addr).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("recall: cannot listen on {addr}: {e}");
            return ExitCode::from(1);
        }
    };
    let bound = listener
        .local_addr()
        .map_or_else(|_| addr.clone(), |a| a.to_string());
    let upstreams: Vec<String> = config_summary(&app);
    tracing::info!(
        addr = %bound,
        config = %path.display(),
        storage = ?app.config.storage.backend,
        upstreams = %upstreams.join("; "),
        workers = app.config.server.serving_threads(),
        "recall listening"
    );
    match recall::serve(listener, app, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("recall: server error: {e}");
            ExitCode::from(1)
        }
    }
}
