-- One repository is one project: the git common dir (`git rev-parse --git-common-dir`, realpath)
-- and its filesystem identity. A directory whose `.git` file points at repository R, a linked
-- worktree of R, and R itself share it. NULL for plain-directory projects, and for git projects
-- recorded before this migration (filled in by the next project.add that compares them).
ALTER TABLE projects ADD COLUMN git_dir TEXT;
ALTER TABLE projects ADD COLUMN git_dev INTEGER;
ALTER TABLE projects ADD COLUMN git_ino INTEGER;
CREATE UNIQUE INDEX projects_git_identity ON projects(git_dev, git_ino);
