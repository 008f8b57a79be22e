//! `dsv4`: the command-line tool (logits, generate, chat, encode, bench).

fn main() -> anyhow::Result<()> {
    Ok(())
}
