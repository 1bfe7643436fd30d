use clap::Parser;

// Each request makes many small, short-lived allocations (documents, JSON values, header maps);
// glibc's allocator spent about a quarter of the server's CPU on them under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
use pulse::config::{Cli, Command};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    // A local .env is a convenience for development; real deployments set the environment.
    let _ = dotenvy::dotenv();
    let cli = Cli::parse();
    pulse::telemetry::init_logging(cli.config.log_format);
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => {
            pulse::App::build(cli.config)
                .await?
                .run_until_stopped()
                .await
        }
        Command::PrintSchema => {
            print!("{}", pulse::graphql::schema::sdl());
            Ok(())
        }
        other => pulse::commands::run(cli.config, other).await,
    }
}
