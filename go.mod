module github.com/admitdev/admit

go 1.26
