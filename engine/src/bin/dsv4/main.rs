//! `dsv4`: the command-line tool of dsv4-chat (logits, generate, chat, encode, bench).

mod logits;
mod npy;

use clap::{Parser, Subcommand, ValueEnum};
use dsv4_engine::api::Numerics;
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "dsv4", version = env!("CARGO_PKG_VERSION"), about = "DeepSeek-V4-Flash engine tools")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum)]
enum NumericsArg {
    Reference,
    Official,
}

impl From<NumericsArg> for Numerics {
    fn from(n: NumericsArg) -> Self {
        match n {
            NumericsArg::Reference => Numerics::Reference,
            NumericsArg::Official => Numerics::Official,
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Teacher-forced logits: prefill `prompt_ids`, then feed each of `decode_fed_ids` with the
    /// cache; writes a float32 .npy of shape [1 + len(decode_fed_ids), vocab].
    Logits {
        #[arg(long)]
        model: PathBuf,
        /// JSON with `prompt_ids` and `decode_fed_ids` (the golden tokens.json format).
        #[arg(long)]
        tokens: PathBuf,
        #[arg(long)]
        out: PathBuf,
        #[arg(long, value_enum, default_value = "reference")]
        numerics: NumericsArg,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Logits {
            model,
            tokens,
            out,
            numerics,
        } => logits::run(&model, &tokens, &out, numerics.into()),
    }
}
