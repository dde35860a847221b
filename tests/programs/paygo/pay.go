// pay: a static Go tool an agent runs to make a payment (the standard library only).
//
//	pay URL AMOUNT PAYEE [IDEMPOTENCY-KEY]
//
// POSTs {"amount": AMOUNT, "to": PAYEE} to URL/payments and prints the answer's body.
package main

import (
	"bytes"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
)

func main() {
	if len(os.Args) < 4 {
		fmt.Fprintln(os.Stderr, "usage: pay URL AMOUNT PAYEE [KEY]")
		os.Exit(2)
	}
	amount, err := strconv.Atoi(os.Args[2])
	if err != nil {
		fmt.Fprintln(os.Stderr, "pay: the amount is not a number")
		os.Exit(2)
	}
	body := fmt.Sprintf(`{"amount": %d, "to": %q}`, amount, os.Args[3])
	req, _ := http.NewRequest("POST", os.Args[1]+"/payments", bytes.NewBufferString(body))
	req.Header.Set("Content-Type", "application/json")
	if len(os.Args) > 4 {
		req.Header.Set("Idempotency-Key", os.Args[4])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		fmt.Println("failed:", err)
		os.Exit(1)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	fmt.Println(string(out))
}
