//! What the build needs beyond the Rust toolchain, found the way the build finds it, and
//! installed with the system's package manager.

use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// One thing the build needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Prerequisite {
    /// bindgen loads libclang to generate RocksDB's Rust bindings.
    Libclang,
    /// RocksDB is C++, compiled by the `cc` crate with `CXX` or `c++`.
    CxxCompiler,
}

impl Prerequisite {
    const ALL: [Prerequisite; 2] = [Prerequisite::Libclang, Prerequisite::CxxCompiler];

    fn what(self) -> &'static str {
        match self {
            Prerequisite::Libclang => "libclang",
            Prerequisite::CxxCompiler => "a C++ compiler",
        }
    }

    fn why(self) -> &'static str {
        match self {
            Prerequisite::Libclang => {
                "RocksDB's Rust bindings are generated at build time by bindgen, which loads libclang"
            }
            Prerequisite::CxxCompiler => "RocksDB, the embedded store, is C++ built from source",
        }
    }

    fn is_present(self) -> bool {
        match self {
            Prerequisite::Libclang => libclang_found(),
            Prerequisite::CxxCompiler => cxx_found(),
        }
    }

    /// The package that provides it, for `manager`.
    fn package(self, manager: PackageManager) -> &'static str {
        match (self, manager) {
            (Prerequisite::Libclang, PackageManager::Apt) => "libclang-dev",
            (Prerequisite::Libclang, PackageManager::Dnf) => "clang-devel",
            (Prerequisite::Libclang, PackageManager::Pacman) => "clang",
            (Prerequisite::CxxCompiler, PackageManager::Apt) => "g++",
            (Prerequisite::CxxCompiler, PackageManager::Dnf) => "gcc-c++",
            (Prerequisite::CxxCompiler, PackageManager::Pacman) => "gcc",
        }
    }
}

/// Says what the build needs and what this machine lacks; `Err` when something is missing.
pub fn check() -> Result<(), String> {
    let missing = missing();
    for prerequisite in Prerequisite::ALL {
        let state = match missing.contains(&prerequisite) {
            true => "missing",
            false => "found",
        };
        println!(
            "{:<16} {state:<8} ({})",
            prerequisite.what(),
            prerequisite.why()
        );
    }
    match missing.is_empty() {
        true => Ok(()),
        false => Err(how_to_install(&missing)),
    }
}

/// Installs what is missing, saying what and why, when this process may (root, or `sudo`
/// without a password); otherwise `Err` with the exact command to run.
pub fn install_missing() -> Result<(), String> {
    let missing = missing();
    if missing.is_empty() {
        return Ok(());
    }
    let Some(manager) = PackageManager::on_this_machine() else {
        return Err(how_to_install(&missing));
    };
    let Some(privilege) = Privilege::available() else {
        return Err(how_to_install(&missing));
    };
    for prerequisite in &missing {
        eprintln!(
            "installing {} ({}): {}",
            prerequisite.package(manager),
            prerequisite.what(),
            prerequisite.why()
        );
    }
    for step in manager.install_steps(&missing) {
        run_quietly(privilege, &step)?;
    }
    let still_missing = self::missing();
    match still_missing.is_empty() {
        true => Ok(()),
        false => Err(format!(
            "still missing after installing: {}",
            names(&still_missing)
        )),
    }
}

fn missing() -> Vec<Prerequisite> {
    Prerequisite::ALL
        .into_iter()
        .filter(|p| !p.is_present())
        .collect()
}

fn names(prerequisites: &[Prerequisite]) -> String {
    let names: Vec<&str> = prerequisites.iter().map(|p| p.what()).collect();
    names.join(", ")
}

/// The message that stops a run: what is missing, why, and the command that installs it.
fn how_to_install(missing: &[Prerequisite]) -> String {
    let mut message = String::from("this machine lacks what the build needs:\n");
    let libclang_missing = missing.contains(&Prerequisite::Libclang);
    if let Some(path) = std::env::var_os("LIBCLANG_PATH").filter(|_| libclang_missing) {
        let path = PathBuf::from(path);
        message += &format!(
            "  (LIBCLANG_PATH={} holds no libclang, and it is the only place the build looks: \
             correct it, or unset it)\n",
            path.display()
        );
    }
    for prerequisite in missing {
        message += &format!("  {}: {}\n", prerequisite.what(), prerequisite.why());
    }
    match PackageManager::on_this_machine() {
        Some(manager) => {
            let steps = manager.install_steps(missing);
            let commands: Vec<String> = steps
                .iter()
                .map(|s| format!("sudo {}", s.join(" ")))
                .collect();
            message += &format!(
                "install it with:\n  {}\nthen run this again",
                commands.join(" && ")
            );
        }
        None => {
            message += "install clang (with its library) and a C++ compiler with your system's \
                        package manager, or set LIBCLANG_PATH to the directory holding libclang";
        }
    }
    message
}

/// Runs `step` with `privilege`, its output shown only if it fails.
fn run_quietly(privilege: Privilege, step: &[String]) -> Result<(), String> {
    let mut command = match privilege {
        Privilege::Root => Command::new(&step[0]),
        // sudo resets the environment: the variable goes through `env`.
        Privilege::Sudo => {
            let mut sudo = Command::new("sudo");
            sudo.args(["-n", "env", "DEBIAN_FRONTEND=noninteractive", &step[0]]);
            sudo
        }
    };
    command
        .args(&step[1..])
        .env("DEBIAN_FRONTEND", "noninteractive");
    let output = command
        .output()
        .map_err(|error| format!("cannot run `{}`: {error}", step.join(" ")))?;
    if output.status.success() {
        return Ok(());
    }
    Err(format!(
        "`{}` failed ({}):\n{}{}",
        step.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    ))
}

/// How this process may install packages.
#[derive(Clone, Copy)]
enum Privilege {
    Root,
    /// `sudo -n`: allowed without a password.
    Sudo,
}

impl Privilege {
    fn available() -> Option<Self> {
        let uid = Command::new("id").arg("-u").output().ok()?;
        if String::from_utf8_lossy(&uid.stdout).trim() == "0" {
            return Some(Privilege::Root);
        }
        let sudo = Command::new("sudo")
            .args(["-n", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        sudo.ok().filter(|s| s.success()).map(|_| Privilege::Sudo)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PackageManager {
    Apt,
    Dnf,
    Pacman,
}

impl PackageManager {
    fn on_this_machine() -> Option<Self> {
        let path = std::env::var_os("PATH")?;
        [
            ("apt-get", PackageManager::Apt),
            ("dnf", PackageManager::Dnf),
            ("pacman", PackageManager::Pacman),
        ]
        .into_iter()
        .find(|(program, _)| on_path(program, &path))
        .map(|(_, manager)| manager)
    }

    /// The commands that install `missing`, each as its words.
    fn install_steps(self, missing: &[Prerequisite]) -> Vec<Vec<String>> {
        let words = |line: &str| line.split(' ').map(str::to_owned).collect::<Vec<_>>();
        let packages: Vec<&str> = missing.iter().map(|p| p.package(self)).collect();
        let packages = packages.join(" ");
        match self {
            PackageManager::Apt => vec![
                words("apt-get update -qq"),
                words(&format!("apt-get install -y -qq {packages}")),
            ],
            PackageManager::Dnf => vec![words(&format!("dnf install -y -q {packages}"))],
            PackageManager::Pacman => {
                vec![words(&format!("pacman -S --noconfirm --needed {packages}"))]
            }
        }
    }
}

/// Whether `program` is an executable file in one of `path`'s directories.
fn on_path(program: &str, path: &OsStr) -> bool {
    std::env::split_paths(path).any(|dir| dir.join(program).is_file())
}

fn cxx_found() -> bool {
    if std::env::var_os("CXX").is_some() {
        return true;
    }
    let Some(path) = std::env::var_os("PATH") else {
        return false;
    };
    ["c++", "g++", "clang++"]
        .into_iter()
        .any(|program| on_path(program, &path))
}

/// Looks where clang-sys (bindgen's loader) looks: `LIBCLANG_PATH`, `llvm-config --libdir`,
/// then the system's library directories; on macOS, the Xcode command-line tools.
fn libclang_found() -> bool {
    if cfg!(target_os = "macos") {
        return Path::new("/Library/Developer/CommandLineTools/usr/lib/libclang.dylib").is_file()
            || command_succeeds("xcode-select", &["-p"]);
    }
    // Set, it is the only place clang-sys looks: a file by its name, or a directory.
    if let Some(path) = std::env::var_os("LIBCLANG_PATH") {
        let path = PathBuf::from(path);
        let named = |p: &Path| {
            p.file_name()
                .is_some_and(|n| is_libclang(&n.to_string_lossy()))
        };
        return (path.is_file() && named(&path)) || holds_libclang(&path);
    }
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(libdir) = llvm_config_libdir() {
        dirs.push(libdir);
    }
    if let Some(paths) = std::env::var_os("LD_LIBRARY_PATH") {
        dirs.extend(std::env::split_paths(&paths));
    }
    dirs.extend(system_library_dirs());
    dirs.iter().any(|dir| holds_libclang(dir))
}

fn command_succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|status| status.success())
}

fn llvm_config_libdir() -> Option<PathBuf> {
    let output = Command::new("llvm-config").arg("--libdir").output().ok()?;
    let libdir = String::from_utf8(output.stdout).ok()?;
    output
        .status
        .success()
        .then(|| PathBuf::from(libdir.trim()))
}

/// The fixed directories, and each `/usr/lib/llvm-*/lib` (Debian's versioned LLVM).
fn system_library_dirs() -> Vec<PathBuf> {
    let mut dirs: Vec<PathBuf> = [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib64",
        "/usr/lib",
        "/usr/local/lib",
        "/usr/lib64/llvm",
    ]
    .iter()
    .map(PathBuf::from)
    .collect();
    if let Ok(entries) = std::fs::read_dir("/usr/lib") {
        let versioned = entries
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("llvm-"))
            .map(|e| e.path().join("lib"));
        dirs.extend(versioned);
    }
    dirs
}

/// Whether `dir` holds a shared libclang (`libclang.so`, `libclang.so.16`, `libclang-16.so.1`).
fn holds_libclang(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries
        .flatten()
        .any(|entry| is_libclang(&entry.file_name().to_string_lossy()))
}

fn is_libclang(file_name: &str) -> bool {
    let shared = file_name.ends_with(".so") || file_name.contains(".so.");
    let named = file_name.starts_with("libclang.") || file_name.starts_with("libclang-");
    // libclang-cpp is the C++ library, which bindgen cannot load.
    shared && named && !file_name.starts_with("libclang-cpp")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libclang_is_recognised_by_its_shared_library_names_only() {
        for name in [
            "libclang.so",
            "libclang.so.1",
            "libclang-16.so.1",
            "libclang-14.so",
        ] {
            assert!(is_libclang(name), "{name}");
        }
        for name in [
            "libclang.a",
            "libclangBasic.so",
            "libclang-cpp.so.16",
            "libclang.h",
        ] {
            assert!(!is_libclang(name), "{name}");
        }
    }

    #[test]
    fn a_directory_holds_libclang_only_with_the_library_in_it() {
        let dir = std::env::temp_dir().join(format!("xtask-libclang-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(!holds_libclang(&dir));
        std::fs::write(dir.join("libclang-16.so.1"), b"").unwrap();
        assert!(holds_libclang(&dir));
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_install_command_names_each_missing_package_for_the_manager() {
        let both = [Prerequisite::Libclang, Prerequisite::CxxCompiler];
        let apt: Vec<String> = PackageManager::Apt
            .install_steps(&both)
            .iter()
            .map(|s| s.join(" "))
            .collect();
        assert_eq!(
            apt,
            [
                "apt-get update -qq",
                "apt-get install -y -qq libclang-dev g++"
            ]
        );
        let dnf = PackageManager::Dnf.install_steps(&[Prerequisite::Libclang]);
        assert_eq!(dnf[0].join(" "), "dnf install -y -q clang-devel");
    }
}
