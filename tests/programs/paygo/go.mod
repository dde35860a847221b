module paygo

go 1.19
