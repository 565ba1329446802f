//! One module per subcommand.

pub mod archive;
