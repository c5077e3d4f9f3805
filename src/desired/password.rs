//! The one impure step: drawing a password. Kept apart so every builder stays deterministic.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use super::BuildError;

/// Random bytes in a generated password: 256 bits, beyond any brute force.
pub const PASSWORD_BYTES: usize = 32;

/// A new password from the operating system's CSPRNG (43 URL-safe base64 characters).
pub fn generate_password() -> Result<String, BuildError> {
    let mut bytes = [0u8; PASSWORD_BYTES];
    getrandom::fill(&mut bytes)?;
    Ok(password_from_bytes(&bytes))
}

/// The password made of `bytes`: plain ASCII, so it is safe in env vars, URLs and shells.
pub fn password_from_bytes(bytes: &[u8; PASSWORD_BYTES]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}
