use clap::Parser;
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
