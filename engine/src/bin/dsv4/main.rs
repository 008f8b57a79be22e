//! `dsv4`: the command-line tool of dsv4-chat (logits, generate, chat, encode, bench).

mod bench;
mod chat;
mod kernels_info;
mod logits;
mod npy;

use clap::{Parser, Subcommand, ValueEnum};
use dsv4_engine::api::{Numerics, SamplingParams, ThinkingMode};
use std::path::PathBuf;

#[derive(Parser)]
// The version names the commit (short hash, `-dirty`, or `unknown`; see engine/build.rs), so a bug report
// from an installed package says exactly what was built.
#[command(
    name = "dsv4",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("DSV4_GIT_COMMIT"), ")"),
    about = "DeepSeek-V4-Flash engine tools"
)]
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

#[derive(Clone, Copy, ValueEnum)]
enum ThinkingArg {
    Off,
    High,
    Max,
}

/// Model and sampling options shared by `chat` and `generate`.
#[derive(clap::Args)]
struct RunArgs {
    /// Checkpoint directory (default: the built-in demo model, whose replies are noise).
    #[arg(long)]
    model: Option<PathBuf>,
    #[arg(long, value_enum, default_value = "official")]
    numerics: NumericsArg,
    #[arg(long, default_value_t = 1024)]
    max_tokens: u32,
    /// 0 = greedy.
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    #[arg(long, default_value_t = 0)]
    top_k: u32,
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    #[arg(long)]
    seed: Option<u64>,
    /// Stop strings (repeatable).
    #[arg(long = "stop")]
    stop: Vec<String>,
    #[arg(long, value_enum, default_value = "off")]
    thinking: ThinkingArg,
    #[arg(long)]
    system: Option<String>,
}

impl RunArgs {
    fn options(&self) -> chat::ChatOptions {
        chat::ChatOptions {
            model: self.model.clone(),
            numerics: self.numerics.into(),
            sampling: SamplingParams {
                temperature: self.temperature,
                top_p: self.top_p,
                top_k: self.top_k,
                min_p: self.min_p,
                seed: self.seed,
                max_tokens: self.max_tokens,
                stop_strings: self.stop.clone(),
            },
            thinking: match self.thinking {
                ThinkingArg::Off => ThinkingMode::Off,
                ThinkingArg::High => ThinkingMode::High,
                ThinkingArg::Max => ThinkingMode::Max,
            },
            system: self.system.clone(),
        }
    }
}

#[derive(Subcommand)]
enum Command {
    /// Decode throughput of a full-size synthetic DeepSeek-V4-Flash on GPU 0 (random weights).
    Bench(bench::BenchArgs),
    /// Generate one reply to a prompt, streamed as it is produced.
    Generate {
        #[arg(long)]
        prompt: String,
        #[command(flatten)]
        run: RunArgs,
    },
    /// Interactive chat in the terminal over the engine thread.
    Chat {
        #[command(flatten)]
        run: RunArgs,
    },
    /// Render and tokenize conversations: reads a JSON list of cases (`name`, `messages`,
    /// `thinking`) and prints `[{"name", "rendered", "ids"}]`.
    Encode {
        #[arg(long)]
        cases: PathBuf,
    },
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
    /// Print the precompiled CUDA kernels embedded in this binary (SASS architectures, PTX).
    Kernels(kernels_info::KernelsArgs),
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
        Command::Bench(args) => bench::run(&args),
        Command::Generate { prompt, run } => chat::generate(&run.options(), &prompt),
        Command::Chat { run } => chat::chat(&run.options()),
        Command::Encode { cases } => {
            let text = std::fs::read_to_string(&cases)?;
            let tok = dsv4_engine::chat::Tokenizer::bundled()?;
            println!("{}", dsv4_engine::chat::encode_cases(&text, &tok)?);
            Ok(())
        }
        Command::Kernels(args) => Ok(kernels_info::run(&args)?),
    }
}
