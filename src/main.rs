use std::path::PathBuf;
use std::process::ExitCode;

use recall::config::{Config, LogFormat};
use tracing_subscriber::EnvFilter;

// Many small, short-lived allocations per request (JSON, headers, chunks)
// and long-lived message text side by side: mimalloc keeps both cheaper
// and less fragmented than the system allocator.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const USAGE: &str = "usage: recall [--config PATH]\n\n\
  --config PATH   config file (default: $RECALL_CONFIG, else config/recall.toml)";

fn config_path() -> Result<PathBuf, String> {
    let mut args = std::env::args().skip(1);
    let mut path = None;
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--config" | "-c" => {
                path = Some(args.next().ok_or("--config needs a path")?);
            }
            s if s.starts_with("--config=") => path = Some(s["--config=".len()..].to_owned()),
            "--help" | "-h" => return Err(String::new()),
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    Ok(path
        .or_else(|| std::env::var("RECALL_CONFIG").ok())
        .unwrap_or_else(|| "config/recall.toml".into())
        .into())
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

#[tokio::main]
async fn main() -> ExitCode {
    let path = match config_path() {
        Ok(p) => p,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("recall: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let config = match Config::load(&path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("recall: {e}");
            return ExitCode::from(2);
        }
    };
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
    tracing::info!(addr = %bound, config = %path.display(), "recall listening");
    match recall::serve(listener, app, shutdown_signal()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("recall: server error: {e}");
            ExitCode::from(1)
        }
    }
}
