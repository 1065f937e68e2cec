//! `idem migrate`: applies the migrations and exits.

use super::args::DbArgs;

/// `idem migrate`.
pub async fn run(db: DbArgs) -> anyhow::Result<()> {
    db.open().await?;
    println!("migrations applied");
    Ok(())
}
