"""Signed versions: SSH signatures (the SSHSIG format of `ssh-keygen -Y sign`, as git signs
with `gpg.format=ssh`) over a version id, the keys that make them (a key file, or the
ssh-agent), the allowed-signers file that says whose are trusted, and where a repository
keeps them (`signatures/<version id>/`). See docs/format.md ("Signatures")."""
